// The ActivationSource over a dump file (kept apart from the evaluator so that code using only
// in-memory sources does not link the HDF5 reader).
#include "eval/evaluator.h"

namespace oscar {
namespace {

class DumpActivationSource final : public ActivationSource {
 public:
  explicit DumpActivationSource(const std::string& path) : reader_(path) {}
  const DumpInfo& info() const override { return reader_.info(); }
  std::string path() const override { return reader_.path(); }
  LayerActivations read(int layer, int64_t first, int64_t count) const override {
    return reader_.read_layer(layer, first, count);
  }

 private:
  DumpReader reader_;
};

}  // namespace

std::unique_ptr<ActivationSource> open_dump_source(const std::string& path) {
  return std::make_unique<DumpActivationSource>(path);
}

}  // namespace oscar
