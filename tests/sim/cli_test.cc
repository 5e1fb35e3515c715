// Runs the built `atoll` binary: bad flags must fail with a clear message and exit code != 0.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr together
};

CliRun Atoll(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(ATOLL_BIN) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return r;
}

TEST(SimCli, BadFlagsFailClearly) {
  struct Case {
    const char* args;
    const char* says;
  } cases[] = {
      {"fleet goodput --chips=-5", "--chips"},
      {"fleet goodput --chips 0", "--chips"},
      {"fleet goodput --mtbi-years 0", "--mtbi-years"},
      {"fleet goodput --learners 4 --quorum 5", "quorum"},
      {"fleet goodput --repair-dist weibull", "--repair-dist"},
      {"fleet goodput --chips 1000 --slice-chips 256", "learners"},
      {"fleet bandwidth --sites 1", "--sites"},
      {"fleet bandwidth --fragments 48", "fragments"},
  };
  for (const auto& c : cases) {
    const CliRun r = Atoll(c.args);
    EXPECT_NE(r.code, 0) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
}

TEST(SimCli, HelpExplainsFlagsWithDefaults) {
  const CliRun r = Atoll("fleet goodput --help");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"--chips", "1200000", "--mtbi-years", "--repair-hours", "--restart-s", "70", "--detect-s",
                        "--shrink-s", "--grow-s", "--learners", "--quorum", "--days", "--seeds"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(SimCli, JsonRunsAndParses) {
  const CliRun r = Atoll("fleet goodput --chips 50000 --days 0.5 --seeds 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto start = r.out.find('[');
  ASSERT_NE(start, std::string::npos);
  const auto end = r.out.rfind(']');
  const auto j = nlohmann::json::parse(r.out.substr(start, end - start + 1));
  EXPECT_EQ(j.size(), 4u);
  const CliRun b = Atoll("fleet bandwidth");
  EXPECT_EQ(b.code, 0);
  EXPECT_NE(b.out.find("0.8333"), std::string::npos) << b.out;
}

// The fleet model's former name still works, with a note naming the new one.
TEST(SimCli, TheOldNameSimStillRunsAndSaysTheNewOne) {
  const CliRun r = Atoll("sim bandwidth --json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("`atoll sim` is now `atoll fleet`"), std::string::npos) << r.out;
  EXPECT_EQ(Atoll("fleet bandwidth --json").out.find("is now"), std::string::npos);
}

}  // namespace
