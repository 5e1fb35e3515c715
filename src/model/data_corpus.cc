// Extraction of the default public-domain corpora from their Debian packages, and reading of
// user text inputs. See atoll/model/data.h.
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <string_view>

#include "atoll/core/file.h"
#include "atoll/model/data.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

void Log(const std::function<void(const std::string&)>& log, const std::string& line) {
  if (log) log(line);
}

// Runs a fixed command line (no user input in it) and returns its stdout.
StatusOr<std::string> RunCommand(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return UnavailableError("cannot run: " + command);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int rc = ::pclose(pipe);
  if (rc != 0) {
    return UnavailableError("'" + command + "' failed (exit status " +
                            std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : rc) + ")");
  }
  return out;
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Applies `fn(line) → keep?` to each line (without '\n'); fn may edit the line. Lines are
// right-trimmed; control bytes other than tab (e.g. the fortunes' overstrike backspaces) dropped.
template <typename Fn>
std::string MapLines(std::string_view text, Fn fn) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  std::string line;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    line.clear();
    for (char c : text.substr(pos, nl - pos)) {
      if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') line.push_back(c);
    }
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (fn(line)) {
      out += line;
      out.push_back('\n');
    }
    pos = nl + 1;
  }
  return out;
}

// KJV from `bible`: "  12 verse text" → "verse text"; chapter headings ("Genesis 1") kept.
std::string CleanKjv(std::string_view raw) {
  bool blank = true;
  return MapLines(raw, [&blank](std::string& line) {
    size_t i = line.find_first_not_of(' ');
    if (i == std::string::npos) {  // collapse runs of blank lines
      bool keep = !blank;
      blank = true;
      line.clear();
      return keep;
    }
    size_t j = line.find(' ', i);
    if (i > 0 && j != std::string::npos && IsDigits(std::string_view(line).substr(i, j - i))) {
      line.erase(0, j + 1);
    }
    blank = false;
    return true;
  });
}

// WEB from diatheke: "Genesis 1:1: text" → "text"; poetry continuation lines kept; the module
// tag "(engWEB2015eb)" dropped.
std::string CleanWeb(std::string_view raw) {
  return MapLines(raw, [](std::string& line) {
    size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos) return false;
    if (line.compare(start, std::string::npos, "(engWEB2015eb)") == 0) return false;
    size_t colon = line.find(": ", start);
    if (colon != std::string::npos) {
      std::string_view head = std::string_view(line).substr(start, colon - start);
      size_t sp = head.rfind(' ');
      if (sp != std::string_view::npos && sp > 0) {
        std::string_view ref = head.substr(sp + 1);  // "c:v"
        size_t c = ref.find(':');
        if (c != std::string_view::npos && IsDigits(ref.substr(0, c)) && IsDigits(ref.substr(c + 1)) &&
            std::isalnum(static_cast<unsigned char>(head[0]))) {
          line.erase(0, colon + 2);
          return !line.empty();
        }
      }
    }
    line.erase(0, start);
    return true;
  });
}

// Fortune files: entries separated by "%" lines become blank-line-separated paragraphs.
std::string CleanFortunes(std::string_view raw) {
  return MapLines(raw, [](std::string& line) {
    if (line == "%") line.clear();
    return true;
  });
}

}  // namespace

namespace {

// The default sources found so far, and the Debian packages that would provide those absent.
struct CorpusSearch {
  const std::function<void(const std::string&)>& log;
  std::vector<CorpusText> found;
  std::vector<std::string> missing;
};

void AddKingJamesBible(CorpusSearch& s) {
  if (!FileExists("/usr/bin/bible") && !FileExists("/usr/games/bible")) {
    s.missing.push_back("bible-kjv bible-kjv-text");
    return;
  }
  auto raw = RunCommand("bible -l1000 'Gen1:1-Rev22:21'");
  if (raw.ok() && !raw->empty()) {
    s.found.push_back({"kjv", "King James Bible (Debian bible-kjv: bible -l1000 Gen1:1-Rev22:21)", CleanKjv(*raw)});
  } else {
    Log(s.log, "data: skipping the King James Bible: " + raw.status().message());
  }
}

void AddWorldEnglishBible(CorpusSearch& s) {
  if (!FileExists("/usr/bin/diatheke")) {
    s.missing.push_back("diatheke sword-text-web");
    return;
  }
  auto raw = RunCommand("diatheke -b engWEB2015eb -f plain -k 'Genesis 1:1-Revelation 22:21'");
  if (raw.ok() && raw->size() > 1000) {
    s.found.push_back({"web", "World English Bible (Debian sword-text-web via diatheke)", CleanWeb(*raw)});
  } else {
    Log(s.log, "data: skipping the World English Bible (module engWEB2015eb not readable)");
  }
}

// All fortune files, in name order, as one text.
void AddFortunes(CorpusSearch& s) {
  const fs::path fortunes = "/usr/share/games/fortunes";
  std::error_code ec;
  if (!fs::is_directory(fortunes, ec)) {
    s.missing.push_back("fortunes fortunes-min");
    return;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fortunes, ec)) {
    // A fortune file is the one with a ".dat" index beside it (skips .u8 links and indexes).
    if (e.path().extension() == ".dat") {
      fs::path text = e.path();
      text.replace_extension();
      if (fs::is_regular_file(text, ec)) files.push_back(text);
    }
  }
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) {
    auto text = ReadFile(f.string());
    if (text.ok()) all += CleanFortunes(*text);
  }
  if (!all.empty()) {
    s.found.push_back({"fortunes", "fortunes (Debian fortunes, fortunes-min)", std::move(all)});
  }
}

}  // namespace

StatusOr<std::vector<CorpusText>> ExtractDefaultCorpora(const std::function<void(const std::string&)>& log) {
  CorpusSearch s{log, {}, {}};
  AddKingJamesBible(s);
  AddWorldEnglishBible(s);
  AddFortunes(s);
  if (s.found.empty()) {
    std::string pk;
    for (const auto& m : s.missing) pk += (pk.empty() ? "" : " ") + m;
    return FailedPreconditionError("no default corpus is installed (Debian packages: " + pk +
                                   "); run scripts/setup, or pass your own text with --input FILE_OR_DIR");
  }
  return std::move(s.found);
}

StatusOr<std::vector<CorpusText>> ReadTextInputs(const std::vector<std::string>& inputs) {
  std::vector<CorpusText> out;
  auto add_file = [&out](const fs::path& p, bool from_folder) -> Status {
    ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(p.string()));
    std::string_view head = std::string_view(text).substr(0, 8192);
    if (head.find('\0') != std::string_view::npos) {
      if (from_folder) return Status::Ok();  // binary file in a folder: skipped
      return InvalidArgumentError(p.string() + " looks binary (NUL bytes); pass token shards with --shards");
    }
    out.push_back({p.filename().string(), fs::absolute(p).string(), std::move(text)});
    return Status::Ok();
  };
  for (const auto& in : inputs) {
    std::error_code ec;
    fs::path p(in);
    if (fs::is_directory(p, ec)) {
      ATOLL_ASSIGN_OR_RETURN(auto files, ListFilesRecursive(in));
      for (const auto& f : files) ATOLL_RETURN_IF_ERROR(add_file(f, true));
    } else if (fs::exists(p, ec)) {
      ATOLL_RETURN_IF_ERROR(add_file(p, false));
    } else {
      return NotFoundError("input not found: " + in);
    }
  }
  return out;
}

}  // namespace atl::model
