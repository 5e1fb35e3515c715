// Helpers shared by the libFuzzer targets: a byte reader over the fuzzer's input and a scratch
// folder for the targets that decode files.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace atl::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t Byte() { return n_ ? (--n_, *p_++) : 0; }
  std::string_view Rest() const { return {reinterpret_cast<const char*>(p_), n_}; }

 private:
  const uint8_t* p_;
  size_t n_;
};

// One scratch folder per fuzzer process (removed at exit).
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string d = std::filesystem::temp_directory_path().string() + "/atoll-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::string d;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

// Writes a file without fsync (the fuzzers' scratch files need no durability, only speed).
inline bool WriteScratch(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

inline std::string ReadScratch(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace atl::fuzz
