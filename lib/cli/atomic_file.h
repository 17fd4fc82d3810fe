// Output files appear whole or not at all: tools write to "<path>.tmp-<pid>" and rename on commit;
// an uncommitted temporary is removed when the object dies (errors, exceptions).
#pragma once
#include <string>

namespace oscar {

class AtomicOutputFile {
 public:
  explicit AtomicOutputFile(std::string final_path);
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;
  const std::string& temporary_path() const { return temporary_path_; }
  const std::string& final_path() const { return final_path_; }
  void commit();  // rename temporary -> final

 private:
  std::string final_path_, temporary_path_;
  bool committed_ = false;
};

// Writes text to path atomically, or to stdout when path is empty or "-".
void write_text_output(const std::string& path, const std::string& text);

}  // namespace oscar
