// Replays the fuzzer's inputs in every build (release gcc too, not only the clang fuzzer build):
// each file of tests/fuzz/regressions once crashed the core and must now be rejected with one of
// the core's errors or compile; each seed of tests/fuzz/corpus that ORTModule's disk cache wrote
// must compile, since the engine builds exactly those.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
#include "tests/fuzz/fuzz_pipeline.h"

namespace torch_ort {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> files_in(const std::string& sub) {
  std::vector<fs::path> out;
  const fs::path dir = fs::path(TORCH_ORT_SOURCE_DIR) / "tests" / "fuzz" / sub;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().rfind("README", 0) != 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// "" when the input compiled; the error's text when the core rejected it cleanly. Any other
// exception is a test failure naming the file.
std::string outcome(const fs::path& p) {
  try {
    fuzz::compile_like_the_engine(read_bytes(p));
    return "";
  } catch (const OnnxImportError& e) {
    return e.what();
  } catch (const VerifyError& e) {
    return e.what();
  } catch (const GradientError& e) {
    return e.what();
  } catch (const UnsupportedOpError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << p.filename() << ": " << typeid(e).name() << " escaped: " << e.what();
    return "";
  }
}

TEST(FuzzRegressions, EveryCrashInputIsNowACleanError) {
  const std::vector<fs::path> inputs = files_in("regressions");
  ASSERT_FALSE(inputs.empty());
  for (const fs::path& p : inputs) {
    SCOPED_TRACE(p.filename().string());
    const std::string error = outcome(p);
    // A regression that compiles is fine too (the model was valid all along); when rejected,
    // the message says where.
    if (!error.empty()) {
      EXPECT_THAT(error, testing::MatchesRegex(
                             ".*(node|value|initializer|input|output|graph|model|attribute).*"));
    }
  }
}

TEST(FuzzRegressions, DiskCacheSeedsCompile) {
  int seeds = 0;
  for (const fs::path& p : files_in("corpus")) {
    if (p.filename().string().find(".cache.") == std::string::npos) {
      outcome(p);  // optimized/training graphs: either way, but cleanly
      continue;
    }
    ++seeds;
    EXPECT_EQ(outcome(p), "") << p.filename();
  }
  EXPECT_GE(seeds, 5);
}

}  // namespace
}  // namespace torch_ort
