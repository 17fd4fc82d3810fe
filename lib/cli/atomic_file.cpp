// Atomic output files (see atomic_file.h).
#include "cli/atomic_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/error.h"

namespace oscar {

AtomicOutputFile::AtomicOutputFile(std::string final_path)
    : final_path_(std::move(final_path)),
      temporary_path_(final_path_ + ".tmp-" + std::to_string(getpid())) {
  OSCAR_CHECK(!final_path_.empty(), "no output file given (-o FILE)");
}

AtomicOutputFile::~AtomicOutputFile() {
  if (!committed_) std::remove(temporary_path_.c_str());
}

void AtomicOutputFile::commit() {
  OSCAR_CHECK(std::rename(temporary_path_.c_str(), final_path_.c_str()) == 0, "{}: cannot create output file",
              final_path_);
  committed_ = true;
}

void write_text_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  AtomicOutputFile file(path);
  {
    std::ofstream out(file.temporary_path(), std::ios::binary);
    OSCAR_CHECK(out.good(), "{}: cannot open for writing", path);
    out << text;
    OSCAR_CHECK(out.good(), "{}: write failed", path);
  }
  file.commit();
}

}  // namespace oscar
