// Statistics accumulation (see accumulate.h). Two passes per layer over all dumps: the first reads Q
// and sums C_Q; the second reads K and V, sums K^T K and V^T V and weights values by
// w_t = k_t C_Q k_t^T (needs the finished C_Q). Each stored tensor is decoded once per layer.
// value_scores is computed per sequence from sampled queries (O(samples * T * d) per head).
#include "covariance/accumulate.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <cmath>
#include <memory>
#include <thread>

#include <cblas.h>

#include "cli/progress.h"
#include "common/error.h"
#include "common/parallel.h"

namespace oscar {

void add_gram(const double* rows, int64_t n, int d, double* sum) {
  if (n <= 0) return;
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, static_cast<int>(n), 1.0, rows, d, 1.0, sum, d);
}

void symmetrise_upper(double* matrix, int d) {
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < i; ++j) matrix[static_cast<size_t>(i) * d + j] = matrix[static_cast<size_t>(j) * d + i];
}

namespace {

// One block the accumulation reads: tokens [first, first + count) of a layer of a dump.
struct BlockRead {
  const DumpReader* reader;
  int layer;
  int64_t first, count;
  StoredTensors tensors;
};

// The blocks of the whole run, read in the order the accumulation uses them (layer by layer, pass by
// pass), each one while the previous one is computed on. The computation, the decoding of the next
// block's chunks and the planning of the block after it (HDF5 metadata) are one job on the thread
// pool, claimed one item at a time (the plan, the computation items, then the short decode tasks), so
// that the cores are neither oversubscribed nor idle at the end of a block, also across passes and
// layers, and no decode waits for a plan. Two buffers take turns (the block computed on and the one
// being filled), so after the first blocks no read allocates or touches fresh pages.
class BlockPipeline {
 public:
  BlockPipeline(std::vector<BlockRead> reads, int threads) : reads_(std::move(reads)), threads_(threads) {
    if (!reads_.empty()) next_plan_ = plan(reads_[0]);
    step(0, nullptr);  // the first block, read alone
  }
  const StoredActivations& block() const { return block_; }
  const BlockRead& read() const { return reads_[index_ - 1]; }  // the current block's
  // Runs compute(item, worker) for item in [0, items) on the current block while the next block is
  // decoded and the one after it planned, then makes the next block current.
  void step(int items, const std::function<void(int, int)>& compute) {
    StoredBlockRead decoding = std::move(next_plan_), planned;
    next_plan_ = StoredBlockRead();
    if (index_ < reads_.size()) decoding.bind(spare_);  // HDF5-only datasets are read here
    const BlockRead* after = index_ + 1 < reads_.size() ? &reads_[index_ + 1] : nullptr;
    std::exception_ptr plan_error;
    const int decodes = decoding.tasks();
    scratch_.resize(std::max<size_t>(scratch_.size(), parallel_workers(1 + items + decodes, threads_)));
    parallel_for_dynamic(1 + items + decodes, threads_, [&](int i, int worker) {
      if (i == 0) {  // the only use of HDF5 while the job runs
        try {
          if (after) planned = plan(*after);
        } catch (...) {
          plan_error = std::current_exception();
        }
      } else if (i <= items) {
        compute(i - 1, worker);
      } else {
        decoding.run(i - 1 - items, scratch_[worker]);
      }
    });
    if (plan_error) std::rethrow_exception(plan_error);
    next_plan_ = std::move(planned);
    std::swap(block_, spare_);
    ++index_;
  }

 private:
  static StoredBlockRead plan(const BlockRead& r) {
    return r.reader->plan_stored(r.layer, r.first, r.count, r.tensors);
  }
  std::vector<BlockRead> reads_;
  size_t index_ = 0;  // blocks decoded
  int threads_;
  StoredActivations block_, spare_;
  StoredBlockRead next_plan_;  // of reads_[index_]
  h5::File::ChunkBuffers scratch_;
};

constexpr int64_t kSubRows = kSubBlockTokens;

// n zeroed doubles whose pages are first touched on all threads (see Statistics::allocate).
std::unique_ptr<double[]> parallel_zeros(size_t n, int threads) {
  std::unique_ptr<double[]> buffer(new double[n]);
  constexpr int kPieces = 64;
  parallel_for(kPieces, threads, [&](int i) {
    std::fill(buffer.get() + n * i / kPieces, buffer.get() + n * (i + 1) / kPieces, 0.0);
  });
  return buffer;
}

}  // namespace

int64_t block_tokens_for(int64_t requested, int threads) {
  if (requested > 0) return (requested + kSubRows - 1) / kSubRows * kSubRows;
  return std::clamp<int64_t>(2048 * (threads / 4), 2048, 8192);
}

Statistics accumulate_statistics(const std::vector<std::string>& dumps, const AccumulateOptions& options) {
  OSCAR_CHECK(!dumps.empty(), "no dump given");
  std::vector<std::unique_ptr<DumpReader>> readers;
  for (const auto& path : dumps) readers.push_back(std::make_unique<DumpReader>(path));
  const ModelGeometry geometry = readers[0]->info().geometry;
  Statistics stats;
  stats.geometry = geometry;
  stats.inputs = dumps;
  stats.score_queries = options.score_queries;
  for (const auto& r : readers) {
    const ModelGeometry& g = r->info().geometry;
    OSCAR_CHECK(g.num_q_heads == geometry.num_q_heads && g.num_kv_heads == geometry.num_kv_heads &&
                    g.head_dim == geometry.head_dim && g.num_layers == geometry.num_layers,
                "{}: geometry differs from {} ({}q/{}kv heads, d {} vs {}q/{}kv heads, d {})", r->path(), dumps[0],
                g.num_q_heads, g.num_kv_heads, g.head_dim, geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim);
    OSCAR_CHECK(r->info().queries_kept_last == 0,
                "{}: an evaluation dump (queries kept only for the last {} tokens of each sequence) cannot be used for "
                "calibration", r->path(), r->info().queries_kept_last);
    stats.tokens += r->info().tokens;
  }
  std::vector<int> layers = options.layers.empty() ? readers[0]->info().layers : options.layers;
  for (int layer : layers)
    for (const auto& r : readers)
      OSCAR_CHECK(std::find(r->info().layers.begin(), r->info().layers.end(), layer) != r->info().layers.end(),
                  "{}: layer {} is not in this dump", r->path(), layer);
  if (options.query_stats) {
    const ModelGeometry& q = options.query_stats->geometry;
    OSCAR_CHECK(q.num_kv_heads == geometry.num_kv_heads && q.head_dim == geometry.head_dim &&
                    q.num_q_heads == geometry.num_q_heads,
                "query statistics geometry differs from the dumps'");
    stats.proxy_query_source = options.query_stats_source;
  } else {
    std::string joined;
    for (const auto& d : dumps) joined += (joined.empty() ? "" : ",") + d;
    stats.proxy_query_source = "self:" + joined;
  }

  const int d = geometry.head_dim, hq = geometry.num_q_heads, hkv = geometry.num_kv_heads, g = geometry.group_size();
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(1);  // parallelism is across work items; BLAS calls stay single-threaded
  const size_t dd = static_cast<size_t>(d) * d;
  stats.allocate(layers, threads);
  const int64_t block_tokens = block_tokens_for(options.block_tokens, threads);

  // Work in token units: 2 streaming passes (+1 for scores) per layer per dump.
  const double passes = options.score_queries > 0 ? 3.0 : 2.0;
  Progress progress("accumulate", passes * stats.tokens * layers.size(), "tokens", options.quiet);

  // Work items, many more than threads so that a block's job ends with short items on every core
  // (items of a whole head per block left ~17 % of the 16 threads' time idle at each block's end): an
  // item adds the sub-blocks of one head whose index in the dump is part (mod kParts) into its own
  // partial sum. Pass 1 has hq * kParts items (C_Q); pass 2 hkv * kParts value-proxy items (the
  // longest, first), then 2 * hkv * kParts K^T K and V^T V items. The partial sums are added up in a
  // fixed order at the end of each pass, so the result depends neither on the thread count nor on the
  // block size.
  constexpr int kParts = 4;
  const int items1 = hq * kParts, proxy_items = hkv * kParts, items2 = proxy_items + 2 * hkv * kParts;
  // Buffers reused for the whole run: float64 sub-block rows per worker, the partial sums (zeroed
  // when they are added up).
  struct Scratch {
    std::vector<double> rows, keys, weighted_keys;
  };
  std::vector<Scratch> scratch(threads);
  parallel_for(threads, threads, [&](int w) {
    scratch[w].rows.resize(kSubRows * d);
    scratch[w].keys.resize(kSubRows * d);
    scratch[w].weighted_keys.resize(kSubRows * d);
  });
  const std::unique_ptr<double[]> query_partial = parallel_zeros(hq * kParts * dd, threads),
                                  proxy_partial = parallel_zeros(proxy_items * dd, threads),
                                  gram_partial = parallel_zeros(2 * hkv * kParts * dd, threads);
  std::vector<double> proxy_weight(proxy_items);
  std::vector<std::vector<double>> query_cov(hkv, std::vector<double>(dd));  // C_Q per KV head, full symmetric

  // Every block of the run, in the order the loops below use them.
  std::vector<BlockRead> reads;
  for (int layer : layers)
    for (StoredTensors tensors : {StoredTensors::queries, StoredTensors::keys_values})
      for (const auto& r : readers)
        for (int64_t first = 0; first < r->info().tokens; first += block_tokens)
          reads.push_back({r.get(), layer, first, std::min(block_tokens, r->info().tokens - first), tensors});
  BlockPipeline pipeline(std::move(reads), threads);
  const StoredActivations& block = pipeline.block();
  // Widens rows [first, first + count) of one head of the block; a non-finite value is an error
  // naming the dump, the dataset, the token and the head.
  const DumpReader* reader = nullptr;
  auto widen = [&](const char* name, int heads, int head, int64_t first, int64_t count, double* out) {
    const std::vector<unsigned char>& tensor = name[0] == 'q' ? block.q : name[0] == 'k' ? block.k : block.v;
    const int64_t bad = stored_rows_to_double(tensor, block.dtype, heads, head, d, first, count, out);
    if (bad >= 0)
      fail("{}: /layers/{}/{} holds a non-finite value at token {} (head {})", reader->path(), block.layer, name,
           block.first_token + bad, head);
  };
  // Calls fn(first, rows) for the sub-blocks of the current block whose index in the dump is part
  // (mod kParts); blocks start at multiples of kSubRows.
  auto for_part = [&](int part, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t n = block.tokens, first_sub = block.first_token / kSubRows;
    for (int64_t j = (part - first_sub % kParts + kParts) % kParts; j * kSubRows < n; j += kParts)
      fn(j * kSubRows, std::min(kSubRows, n - j * kSubRows));
  };
  // Adds `count` partial sums of [d, d] into sum in order and zeroes them.
  auto add_partials = [&](double* partials, int count, double* sum) {
    for (int p = 0; p < count; ++p) {
      double* partial = partials + p * dd;
      for (size_t e = 0; e < dd; ++e) sum[e] += partial[e];
      std::fill(partial, partial + dd, 0.0);
    }
  };

  for (int layer : layers) {
    LayerStatistics& ls = *const_cast<LayerStatistics*>(stats.find_layer(layer));
    // Pass 1: C_Q.
    for (const auto& r : readers) {
      for (int64_t done = 0; done < r->info().tokens;) {
        reader = pipeline.read().reader;
        OSCAR_CHECK(block.layer == layer && reader == r.get() && pipeline.read().tensors == StoredTensors::queries,
                    "blocks out of order");
        const int64_t n = block.tokens;
        done += n;
        pipeline.step(items1, [&](int i, int worker) {
          Scratch& s = scratch[worker];
          const int head = i / kParts;
          for_part(i % kParts, [&](int64_t first, int64_t rows) {
            widen("q", hq, head, first, rows, s.rows.data());
            add_gram(s.rows.data(), rows, d, query_partial.get() + i * dd);
          });
        });
        for (int h = 0; h < hkv; ++h) ls.of(Target::key_query).weight[h] += static_cast<double>(n * g);
        progress.advance(static_cast<double>(n));
      }
    }
    parallel_for(hkv, threads, [&](int h) {
      double* sum = ls.of(Target::key_query).sum.data() + h * dd;
      add_partials(query_partial.get() + h * g * kParts * dd, g * kParts, sum);  // the group's heads in order
      symmetrise_upper(sum, d);
      // C_Q for the proxy weights.
      if (options.query_stats) {
        const MatrixD c = options.query_stats->target_matrix(layer, Target::key_query, h);
        std::copy(c.data(), c.data() + dd, query_cov[h].begin());  // symmetric: storage order does not matter
      } else {
        const double inverse_weight = 1.0 / ls.of(Target::key_query).weight[h];
        for (size_t e = 0; e < dd; ++e) query_cov[h][e] = sum[e] * inverse_weight;
      }
    });
    // Pass 2: K^T K, V^T V and sum_t w_t v_t^T v_t with w_t = k_t C_Q k_t^T (>= 0: C_Q is positive
    // semi-definite).
    for (const auto& r : readers) {
      for (int64_t done = 0; done < r->info().tokens;) {
        reader = pipeline.read().reader;
        OSCAR_CHECK(block.layer == layer && reader == r.get() && pipeline.read().tensors == StoredTensors::keys_values,
                    "blocks out of order");
        const int64_t n = block.tokens;
        done += n;
        pipeline.step(items2, [&](int i, int worker) {
          Scratch& s = scratch[worker];
          if (i >= proxy_items) {  // K^T K (heads [0, hkv)) or V^T V (heads [hkv, 2 hkv))
            const int gram = i - proxy_items, head = gram / kParts % hkv;
            const bool keys = gram < hkv * kParts;
            for_part(gram % kParts, [&](int64_t first, int64_t rows) {
              widen(keys ? "k" : "v", hkv, head, first, rows, s.rows.data());
              add_gram(s.rows.data(), rows, d, gram_partial.get() + gram * dd);
            });
            return;
          }
          const int h = i / kParts;
          for_part(i % kParts, [&](int64_t first, int64_t rows) {
            widen("k", hkv, h, first, rows, s.keys.data());
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), d, d, 1.0, s.keys.data(),
                        d, query_cov[h].data(), d, 0.0, s.weighted_keys.data(), d);
            // Rows sqrt(w_t) v_t, so that their Gram matrix is the weighted sum.
            widen("v", hkv, h, first, rows, s.rows.data());
            double total_weight = 0;
            for (int64_t t = 0; t < rows; ++t) {
              const double* k = s.keys.data() + t * d;
              const double* kc = s.weighted_keys.data() + t * d;
              double w = 0;
              for (int c = 0; c < d; ++c) w += kc[c] * k[c];
              w = std::max(w, 0.0);
              total_weight += w;
              const double root = std::sqrt(w);
              double* v = s.rows.data() + t * d;
              for (int c = 0; c < d; ++c) v[c] *= root;
            }
            add_gram(s.rows.data(), rows, d, proxy_partial.get() + i * dd);
            proxy_weight[i] += total_weight;
          });
        });
        for (int h = 0; h < hkv; ++h) {
          ls.of(Target::key_gram).weight[h] += static_cast<double>(n);
          ls.of(Target::value_gram).weight[h] += static_cast<double>(n);
        }
        progress.advance(static_cast<double>(n));
      }
    }
    parallel_for(3 * hkv, threads, [&](int i) {
      const int h = i % hkv;
      const Target target = i < hkv ? Target::value_proxy : i < 2 * hkv ? Target::key_gram : Target::value_gram;
      double* sum = ls.of(target).sum.data() + h * dd;
      if (target == Target::value_proxy) {
        add_partials(proxy_partial.get() + h * kParts * dd, kParts, sum);
        for (int part = 0; part < kParts; ++part) {
          ls.of(target).weight[h] += proxy_weight[h * kParts + part];
          proxy_weight[h * kParts + part] = 0;
        }
      } else {
        add_partials(gram_partial.get() + (i - hkv) * kParts * dd, kParts, sum);
      }
      symmetrise_upper(sum, d);
    });

    // Pass 3: attention outputs of sampled queries, per sequence (causal, never across sequences).
    if (options.score_queries > 0) {
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      for (const auto& r : readers) {
        const auto& offsets = r->info().sequence_offsets;
        for (size_t s = 0; s + 1 < offsets.size(); ++s) {
          const int64_t begin = offsets[s], length = offsets[s + 1] - offsets[s];
          LayerActivations a = r->read_layer(layer, begin, length);
          const int64_t samples = std::min(options.score_queries, length);
          parallel_for(hkv, threads, [&](int h) {
            std::vector<double> outputs(static_cast<size_t>(samples) * g * d, 0.0), logits;
            for (int64_t i = 0; i < samples; ++i) {
              // Evenly spaced positions, the last token included.
              const int64_t t = length - 1 - (i * length) / samples;
              logits.resize(t + 1);
              for (int j = 0; j < g; ++j) {
                const float* q = a.q.data() + (static_cast<size_t>(t) * hq + h * g + j) * d;
                double max_logit = -1e300;
                for (int64_t u = 0; u <= t; ++u) {
                  const float* k = a.k.data() + (static_cast<size_t>(u) * hkv + h) * d;
                  double dot = 0;
                  for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
                  logits[u] = dot * scale;
                  max_logit = std::max(max_logit, logits[u]);
                }
                double total = 0;
                double* o = outputs.data() + (static_cast<size_t>(i) * g + j) * d;
                for (int64_t u = 0; u <= t; ++u) {
                  const double p = std::exp(logits[u] - max_logit);
                  total += p;
                  const float* v = a.v.data() + (static_cast<size_t>(u) * hkv + h) * d;
                  for (int c = 0; c < d; ++c) o[c] += p * v[c];
                }
                for (int c = 0; c < d; ++c) o[c] /= total;
              }
            }
            add_gram(outputs.data(), samples * g, d, ls.of(Target::value_scores).sum.data() + h * dd);
            ls.of(Target::value_scores).weight[h] += static_cast<double>(samples * g);
          });
          progress.advance(static_cast<double>(length));
        }
      }
      for (int h = 0; h < hkv; ++h) symmetrise_upper(ls.of(Target::value_scores).sum.data() + h * dd, d);
    }
  }
  progress.finish();
  return stats;
}

}  // namespace oscar
