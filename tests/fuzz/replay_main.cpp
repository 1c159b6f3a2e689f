// Runs a libFuzzer target's entry point on files, for builds without libFuzzer (gcc, or clang
// without DDPRUN_FUZZ): `fuzz_X [-flags ignored] FILE_OR_DIR...` feeds every file once, as
// libFuzzer's `-runs=0` does. ctest uses it to replay the seed corpus and every regression input
// in the ordinary build, so a crash once found stays fixed everywhere.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
int replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", file.c_str());
    return 1;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  int files = 0, errors = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') continue;
    const std::filesystem::path p(arg);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p)) {
        if (!e.is_regular_file()) continue;
        errors += replay(e.path());
        ++files;
      }
    } else {
      errors += replay(p);
      ++files;
    }
  }
  std::printf("replayed %d input(s)\n", files);
  return errors == 0 ? 0 : 1;
}
