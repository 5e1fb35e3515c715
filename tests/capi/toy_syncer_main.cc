// atoll_toy_syncer PORT_FILE TOKEN: the toy syncer of toy_syncer.h (P = 4, H = 4, τ = 1, every
// value 0.25) as a process, for the Python tests. Writes its port to PORT_FILE, then serves until
// its standard input closes (the test ends) or 300 s pass; prints the rounds closed and Θ's mean.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "toy_syncer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: atoll_toy_syncer PORT_FILE TOKEN\n");
    return 2;
  }
  toy_syncer* s = toy_syncer_start(4, 4, 1, 0.25f, argv[2]);
  if (s == nullptr) return 1;
  {
    std::ofstream(std::string(argv[1]) + ".tmp") << toy_syncer_port(s) << "\n";
    std::rename((std::string(argv[1]) + ".tmp").c_str(), argv[1]);
  }
  pollfd in{STDIN_FILENO, POLLIN, 0};
  char buf[64];
  for (int i = 0; i < 300; ++i) {  // 300 s at most
    if (::poll(&in, 1, 1000) > 0 && ::read(STDIN_FILENO, buf, sizeof(buf)) <= 0) break;
  }
  std::printf("rounds %lld mean %.6f\n", static_cast<long long>(toy_syncer_rounds(s)), toy_syncer_mean(s));
  toy_syncer_stop(s);
  return 0;
}
