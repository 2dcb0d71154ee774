#include "train_distributed.h"

#include "corpus.h"
#include "errors.h"
#include "gpt.h"
#include "loopback.h"
#include "output_path.h"
#include "progress.h"
#include "rank_launcher.h"
#include "statistics.h"
#include "train_strategy.h"
#include "units.h"

#ifdef CKPT_CLI_HAVE_DISTRIBUTED
#include <ckpt/distributed.h>
#endif
#include <ckpt/memory_tracker.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <utility>

namespace ckpt {
namespace cli {
namespace {

// torchrun sets these four for each process it starts.
bool environment_has_rendezvous() {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') return false;
  }
  return true;
}

}  // namespace

#ifdef CKPT_CLI_HAVE_DISTRIBUTED
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxLocalRanks = 64;
constexpr int64_t kMaxTimeoutSeconds = 86400;
// Once a local rank has failed, how long the others have past the group's timeout to stop.
constexpr std::chrono::seconds kStopMargin(30);

// What one run (one rank of the data-parallel training, or the single process) measured.
struct RankRun {
  std::vector<float> losses;  // over the whole batch: averaged over the ranks
  std::vector<double> step_ms;
  std::vector<double> communication_ms;
  std::vector<int64_t> peak_bytes;
  int64_t peak() const {  // without the warm-up step (AdamW allocates its state there)
    if (peak_bytes.empty()) return 0;
    return *std::max_element(peak_bytes.begin() + (peak_bytes.size() > 1 ? 1 : 0),
                             peak_bytes.end());
  }
};

// The first step is a warm-up (AdamW allocates its state there): left out when enough remain.
double median_after_first(std::vector<double> values) {
  if (values.size() > 2) values.erase(values.begin());
  return models::median(std::move(values));
}

void check_distributed_args(const TrainArgs& args) {
  if (args.ranks_given && args.ranks < 1) {
    throw UsageError("--ranks must be at least 1 (local processes), but got " +
                     std::to_string(args.ranks));
  }
  if (args.world_size_given && args.world_size < 1) {
    throw UsageError("--world-size must be at least 1 (processes of the group), but got " +
                     std::to_string(args.world_size));
  }
  if (args.rank_given && args.rank < 0) {
    throw UsageError("--rank must be at least 0, but got " + std::to_string(args.rank));
  }
  if (args.timeout_seconds < 1 || args.timeout_seconds > kMaxTimeoutSeconds) {
    throw UsageError("--timeout must be between 1 and " + std::to_string(kMaxTimeoutSeconds) +
                     " seconds, but got " + std::to_string(args.timeout_seconds));
  }
  if (args.ranks > 0 && args.rank >= 0) {
    throw UsageError(
        "--ranks N starts N local processes; --rank joins an outside group: use one "
        "of them");
  }
  if (args.ranks > kMaxLocalRanks) {
    throw UsageError("--ranks must be at most " + std::to_string(kMaxLocalRanks) +
                     " local processes, but got " + std::to_string(args.ranks));
  }
  if (args.world_size_given && !args.rank_given && !args.ranks_given) {
    throw UsageError("--world-size needs --rank, this process's rank in the outside group");
  }
  if (args.rank >= 0 && args.world_size < 1) {
    throw UsageError("--rank needs --world-size, the number of processes of the group");
  }
  if (args.rank >= 0 && args.rank >= args.world_size) {
    throw UsageError("--rank " + std::to_string(args.rank) + " is out of range for --world-size " +
                     std::to_string(args.world_size) + ": ranks go from 0 to " +
                     std::to_string(args.world_size - 1));
  }
  if (args.master_port < 1 || args.master_port > 65535) {
    throw UsageError("--master-port must be in [1, 65535], but got " +
                     std::to_string(args.master_port));
  }
  if (!args.plot_path.empty() || !args.trace_path.empty() || !args.chain_path.empty()) {
    throw UsageError(
        "--plot, --trace and --chain are not available with data-parallel training "
        "(--ranks, --rank); run without them");
  }
}

// The options a rank runs with: its share of the batch, and no dropout unless asked for (each
// rank draws its own masks, so a curve with dropout can't match the single process's).
TrainArgs rank_args(TrainArgs args, int world_size) {
  if (args.batch % world_size != 0) {
    throw UsageError("--batch " + std::to_string(args.batch) + " must be divisible by the " +
                     std::to_string(world_size) +
                     " ranks, which each take an equal share; use a multiple of " +
                     std::to_string(world_size));
  }
  if (!args.dropout_given) args.dropout = 0;
  return args;
}

torch::Tensor rows_of(const std::vector<int64_t>& values, const TrainArgs& args, int rank,
                      int world) {
  const int64_t rows = args.batch / world;
  return torch::from_blob(const_cast<int64_t*>(values.data()), {args.batch, args.context},
                          torch::kLong)
      .narrow(0, rank * rows, rows)
      .clone();
}

// A rank's GPT, seeded as `ckpt train` seeds it, and its forward: under the strategy on the rank's
// share of the batch, data-parallel over `group`; alone (no group), the plain chain. Neither
// copied nor moved: the strategy's forward refers to `chain`.
struct RankModel {
  RankModel(const TrainArgs& args, const Corpus& corpus, const models::GptConfig& config,
            const ProcessGroup* group) {
    torch::manual_seed(args.seed);
    chain = models::make_gpt(config);
    chain->train();
    if (args.dtype == "float64") chain->to(torch::kDouble);
    forward = [this](const at::Tensor& x) { return chain->forward(x); };
    if (group != nullptr) {
      TrainArgs local = args;
      local.batch = args.batch / group->world_size();  // a plan is for the rank's share
      forward = strategy_forward(local, corpus, chain).forward;
      parallel = std::make_unique<DataParallel>(chain.ptr(), *group);
    }
  }
  RankModel(const RankModel&) = delete;
  RankModel& operator=(const RankModel&) = delete;

  torch::nn::Sequential chain{nullptr};
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::unique_ptr<DataParallel> parallel;
};

// Trains `args.steps` steps with the seeds of `ckpt train`: data-parallel over `group` under the
// strategy, or (no group) alone on the whole batch without checkpointing.
RankRun train(const TrainArgs& args, const Corpus& corpus, const ProcessGroup* group,
              const std::string& label) {
  const int rank = group != nullptr ? group->rank() : 0;
  const int world = group != nullptr ? group->world_size() : 1;
  const models::GptConfig config = gpt_config(args, corpus);
  RankModel model(args, corpus, config, group);
  const std::unique_ptr<DataParallel>& parallel = model.parallel;
  torch::manual_seed(args.seed + 1);
  std::vector<torch::Tensor> parameters = model.chain->parameters();
  torch::optim::AdamW optimizer(
      parameters,
      torch::optim::AdamWOptions(args.lr).betas(std::make_tuple(0.9, 0.95)).weight_decay(0.1));
  MemoryTracker tracker;
  std::mt19937_64 rng(args.seed);
  std::vector<int64_t> inputs, targets;
  std::unique_ptr<Progress> progress;
  if (rank == 0) progress = std::make_unique<Progress>(label, static_cast<int>(args.steps));
  RankRun run;
  for (int step = 0; step < args.steps; ++step) {
    sample_batch(corpus, args.batch, args.context, rng, inputs, targets);  // the same on all
    const torch::Tensor x = rows_of(inputs, args, rank, world);
    const torch::Tensor y = rows_of(targets, args, rank, world);
    for (torch::Tensor& parameter : parameters) parameter.mutable_grad().reset();
    const int64_t base = tracker.current_bytes();
    tracker.reset_peak();
    const Clock::time_point start = Clock::now();
    if (parallel) parallel->begin_step();
    double loss_value = 0;
    {
      const torch::Tensor loss = torch::nn::functional::cross_entropy(
          model.forward(x).view({-1, config.vocab}), y.view({-1}));
      loss.backward();
      loss_value = loss.item<float>();
    }
    optimizer.step();
    run.step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    run.peak_bytes.push_back(tracker.peak_bytes() - base);
    run.communication_ms.push_back(parallel ? 1e3 * parallel->communication_seconds() : 0.0);
    run.losses.push_back(static_cast<float>(loss_value));
    if (progress) {
      progress->update(step + 1, loss_value,
                       static_cast<double>(x.size(0) * args.context) / (run.step_ms.back() / 1e3),
                       tracker.current_bytes(), run.peak_bytes.back());
    }
  }
  if (progress) progress->finish();
  return run;
}

// The whole batch's losses (the mean of the ranks' equal shares) and every rank's peak.
std::vector<int64_t> gather(const ProcessGroup& group, RankRun& run) {
  torch::Tensor losses =
      torch::tensor(std::vector<double>(run.losses.begin(), run.losses.end()), torch::kDouble);
  group.all_reduce_sum(losses);
  losses /= group.world_size();
  for (size_t i = 0; i < run.losses.size(); ++i) {
    run.losses[i] = static_cast<float>(losses[static_cast<int64_t>(i)].item<double>());
  }
  torch::Tensor peaks = torch::zeros({group.world_size()}, torch::kDouble);
  peaks[group.rank()] = static_cast<double>(run.peak());
  group.all_reduce_sum(peaks);
  std::vector<int64_t> result;
  for (int r = 0; r < group.world_size(); ++r) {
    result.push_back(static_cast<int64_t>(peaks[r].item<double>()));
  }
  return result;
}

double max_difference(const RankRun& a, const RankRun& b) {
  double largest = 0;
  for (size_t i = 0; i < std::min(a.losses.size(), b.losses.size()); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(a.losses[i]) - b.losses[i]));
  }
  return largest;
}

nlohmann::json run_json(const std::string& label, const RankRun& run) {
  return {{"label", label},
          {"peak_bytes", run.peak()},
          {"step_ms", median_after_first(run.step_ms)},
          {"losses", run.losses},
          {"steps", run.losses.size()},
          {"peak_bytes_per_step", run.peak_bytes},
          {"step_ms_per_step", run.step_ms},
          {"final_loss",
           run.losses.empty() ? nlohmann::json(nullptr) : nlohmann::json(run.losses.back())}};
}

struct Report {
  std::string strategy;
  int ranks = 1;
  RankRun parallel;  // rank 0's, with the whole batch's losses
  RankRun single;
  std::vector<int64_t> peak_per_rank;
};

void print_summary(const Report& report) {
  const int64_t largest_peak =
      *std::max_element(report.peak_per_rank.begin(), report.peak_per_rank.end());
  std::printf("\n%-28s %14s %14s %12s %8s\n", "run", "peak memory", "median step", "final loss",
              "steps");
  const auto row = [](const std::string& label, int64_t peak, const RankRun& run) {
    std::printf("%-28s %14s %11.1f ms %12.4f %8zu\n", label.c_str(), format_bytes(peak).c_str(),
                median_after_first(run.step_ms),
                run.losses.empty() ? 0.0 : static_cast<double>(run.losses.back()),
                run.losses.size());
  };
  row("1 process, no checkpoint", report.single.peak(), report.single);
  row(report.strategy + " x " + std::to_string(report.ranks) + " ranks", largest_peak,
      report.parallel);
  std::printf("\npeak per rank:");
  for (const int64_t peak : report.peak_per_rank) std::printf(" %s", format_bytes(peak).c_str());
  std::printf(" (%.1f%% of the single process's)\n",
              100.0 * static_cast<double>(largest_peak) /
                  static_cast<double>(std::max<int64_t>(1, report.single.peak())));
  std::printf("all-reduce in flight per step (rank 0, overlapping the backward): %.1f ms\n",
              median_after_first(report.parallel.communication_ms));
  std::printf("loss curves: largest difference %.3g over %zu steps\n",
              max_difference(report.parallel, report.single), report.parallel.losses.size());
  std::fflush(stdout);
}

void write_json(const TrainArgs& args, const Report& report) {
  nlohmann::json parallel = run_json(report.strategy, report.parallel);
  parallel["communication_ms"] = median_after_first(report.parallel.communication_ms);
  parallel["communication_ms_per_step"] = report.parallel.communication_ms;
  const int64_t largest_peak =
      *std::max_element(report.peak_per_rank.begin(), report.peak_per_rank.end());
  parallel["peak_bytes"] = largest_peak;
  nlohmann::json config = config_json(args);
  config["batch_per_rank"] = args.batch / report.ranks;
  const nlohmann::json document = {
      {"strategy", report.strategy},
      {"ranks", report.ranks},
      {"config", config},
      {"baseline", run_json("no checkpoint, 1 process", report.single)},
      {"data_parallel", parallel},
      {"max_loss_difference", max_difference(report.parallel, report.single)},
      {"peak_bytes_per_rank", report.peak_per_rank},
      {"peak_ratio", static_cast<double>(largest_peak) /
                         static_cast<double>(std::max<int64_t>(1, report.single.peak()))}};
  write_whole_file(args.json_path, document.dump(2) + "\n", "--json");
  std::printf("json:  %s\n", args.json_path.c_str());
}

// A number as the shortest text that reads back as the same double.
std::string exact_text(double value) {
  for (int digits = 6;; ++digits) {
    std::ostringstream text;
    text.precision(digits);
    text << value;
    if (std::stod(text.str()) == value || digits >= 17) return text.str();
  }
}

// The settings every rank must share, one `name=value` line each: with different steps, sizes or
// text, the collectives would mismatch (Gloo aborts); with a different learning rate or seed, the
// replicas would drift apart without a word. Threads, output files and the rendezvous are each
// rank's own.
std::string shared_settings(const TrainArgs& args, const Corpus& corpus) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a of the text
  for (const int64_t token : corpus.tokens) {
    hash = (hash ^ static_cast<uint64_t>(token)) * 1099511628211ULL;
  }
  std::ostringstream corpus_text;
  corpus_text << corpus.tokens.size() << " characters, vocabulary " << corpus.vocabulary.size()
              << ", FNV-1a " << std::hex << hash;
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"--layers", std::to_string(args.layers)},
      {"--width", std::to_string(args.width)},
      {"--heads", std::to_string(args.heads)},
      {"--context", std::to_string(args.context)},
      {"--batch", std::to_string(args.batch)},
      {"--steps", std::to_string(args.steps)},
      {"--strategy", args.strategy},
      {"--seed", std::to_string(args.seed)},
      {"--lr", exact_text(args.lr)},
      {"--dropout", exact_text(args.dropout)},
      {"--untied", args.untied ? "yes" : "no"},
      {"--dtype", args.dtype},
      {"--corpus", corpus_text.str()}};
  std::string text;
  for (const auto& [name, value] : settings) text += name + "=" + value + "\n";
  return text;
}

// Every rank compares every rank's settings with rank 0's, so that each stops with the same
// error naming what differs.
void check_same_settings(const ProcessGroup& group, const TrainArgs& args, const Corpus& corpus) {
  const std::vector<std::string> all = group.all_gather(shared_settings(args, corpus));
  const auto lines = [](const std::string& text) {
    std::vector<std::string> result;
    std::istringstream stream(text);
    for (std::string line; std::getline(stream, line);) result.push_back(line);
    return result;
  };
  const std::vector<std::string> reference = lines(all[0]);
  std::string differences;
  for (size_t i = 0; i < reference.size(); ++i) {
    const std::string name = reference[i].substr(0, reference[i].find('='));
    std::string values;
    bool differs = false;
    for (size_t rank = 0; rank < all.size(); ++rank) {
      const std::vector<std::string> theirs = lines(all[rank]);
      const std::string line = i < theirs.size() ? theirs[i] : name + "=?";
      differs = differs || line != reference[i];
      values += (rank == 0 ? "rank " : ", rank ") + std::to_string(rank) + ": " +
                line.substr(line.find('=') + 1);
    }
    if (differs) differences += (differences.empty() ? "" : "; ") + name + " (" + values + ")";
  }
  if (!differences.empty()) {
    throw UsageError("the ranks were started with different settings: " + differences +
                     ". Start every rank with the same training options");
  }
}

// This process as rank `args.rank` of `args.world_size`: trains, gathers, and on rank 0 runs the
// single process for comparison and reports.
int run_rank(const TrainArgs& given) {
  const TrainArgs args = rank_args(given, static_cast<int>(given.world_size));
  torch::set_num_threads(static_cast<int>(args.threads));
  const Corpus corpus = load_corpus(args.corpus, args.context + 2);
  const ProcessGroup group =
      ProcessGroup::join(RendezvousOptions()
                             .master_addr(args.master_addr)
                             .master_port(static_cast<int>(args.master_port))
                             .rank(static_cast<int>(args.rank))
                             .world_size(static_cast<int>(args.world_size))
                             .timeout(std::chrono::seconds(args.timeout_seconds)));
  check_same_settings(group, args, corpus);
  if (group.rank() == 0) {
    std::printf(
        "ckpt train: data-parallel over %d ranks (c10d, Gloo, %s:%lld), batch %lld = %d x "
        "%lld, strategy %s, %lld steps, dropout %g, %s\n",
        group.world_size(), args.master_addr.c_str(), static_cast<long long>(args.master_port),
        static_cast<long long>(args.batch), group.world_size(),
        static_cast<long long>(args.batch / group.world_size()), args.strategy.c_str(),
        static_cast<long long>(args.steps), args.dropout, args.dtype.c_str());
    std::fflush(stdout);
  }
  Report report;
  report.ranks = group.world_size();
  report.parallel =
      train(args, corpus, &group, args.strategy + " x " + std::to_string(group.world_size()));
  report.strategy = args.strategy;
  report.peak_per_rank = gather(group, report.parallel);
  if (group.rank() != 0) return kExitOk;
  report.single = train(args, corpus, nullptr, "1 process");
  print_summary(report);
  if (!args.json_path.empty()) write_json(args, report);
  return kExitOk;
}

int run_rank_reporting(const TrainArgs& args) {
  const std::string who = "rank " + std::to_string(args.rank) + ": ";
  try {
    return run_rank(args);
  } catch (const UsageError& error) {
    return report_error(who + error.what(), kExitUsage);
  } catch (const c10::Error& error) {
    return report_torch_error(error.what(), error.what_without_backtrace(), who);
  } catch (const std::exception& error) {
    return report_error(who + error.what(), kExitFailure);
  }
}

// --ranks N: N processes on the loopback, forked before this one has done any LibTorch work.
int launch_local_ranks(const TrainArgs& args) {
  rank_args(args, static_cast<int>(args.ranks));  // a bad --batch fails here, once
  const int port = free_loopback_port();
  return launch_ranks(static_cast<int>(args.ranks),
                      std::chrono::seconds(args.timeout_seconds) + kStopMargin, [&](int rank) {
                        TrainArgs own = args;
                        own.rank = rank;
                        own.world_size = args.ranks;
                        own.master_addr = "127.0.0.1";
                        own.master_port = port;
                        own.ranks = 0;
                        return run_rank_reporting(own);
                      });
}

}  // namespace
#endif  // CKPT_CLI_HAVE_DISTRIBUTED

void add_distributed_options(CLI::App* train, TrainArgs& args) {
  train->add_option("--ranks", args.ranks,
                    "Train data-parallel over N local processes (c10d, Gloo on the loopback), "
                    "each on --batch / N sequences, and compare with one process on the whole "
                    "batch without checkpointing");
  train->add_option("--rank", args.rank, "Join an outside group as this rank (with --world-size)");
  train->add_option("--world-size", args.world_size, "Processes of the outside group");
  train->add_option("--master-addr", args.master_addr, "Address of rank 0's rendezvous store")
      ->capture_default_str();
  train->add_option("--master-port", args.master_port, "Port of rank 0's rendezvous store")
      ->capture_default_str();
  train
      ->add_option("--timeout", args.timeout_seconds,
                   "Seconds the ranks wait for each other (the rendezvous, each all-reduce) "
                   "before failing")
      ->capture_default_str();
  train
      ->add_option("--dtype", args.dtype,
                   "Weights and activations of a data-parallel run: float32, or float64 to tell "
                   "the method's error from float32 rounding, which AdamW amplifies over steps")
      ->check(CLI::IsMember({"float32", "float64"}))
      ->capture_default_str();
  // Runs once the whole command line is parsed.
  train->callback([train, &args] {
    const auto given = [train](const char* name) { return train->get_option(name)->count() > 0; };
    args.dropout_given = given("--dropout");
    args.ranks_given = given("--ranks");
    args.rank_given = given("--rank");
    args.world_size_given = given("--world-size");
    for (const char* name : {"--dtype", "--timeout"}) {
      if (given(name) && !wants_distributed(args)) {
        throw CLI::ValidationError(name,
                                   "applies to data-parallel training only (--ranks, "
                                   "--rank or the torchrun environment)");
      }
    }
  });
}

bool wants_distributed(const TrainArgs& args) {
  return args.ranks_given || args.rank_given || args.world_size_given ||
         environment_has_rendezvous();
}

#ifndef CKPT_CLI_HAVE_DISTRIBUTED
int run_train_distributed(const TrainArgs&) {
  throw UsageError(
      "this ckpt was built without ckpt::distributed (its LibTorch has no c10d with Gloo, or "
      "Gloo's headers were missing: Debian's libgloo-dev), so --ranks, --rank and the torchrun "
      "environment are not available. Rebuild ckpt with them");
}
#else
int run_train_distributed(const TrainArgs& given) {
  TrainArgs args = given;
  if (!args.ranks_given && !args.rank_given && !args.world_size_given) {  // torchrun's
    const RendezvousOptions environment = RendezvousOptions::from_environment();
    args.rank = environment.rank();
    args.world_size = environment.world_size();
    args.master_addr = environment.master_addr();
    args.master_port = environment.master_port();
  }
  check_distributed_args(args);
  validate_train_args(args, MachineLimits::of_this_machine());
  if (args.ranks > 0) return launch_local_ranks(args);
  const int code = run_rank_reporting(args);
  // As a forked rank does: c10d's and Gloo's threads (a connection attempt given up at the
  // timeout among them) are not joined, and must not run into the static destructors.
  std::fflush(nullptr);
  _exit(code);
}
#endif

}  // namespace cli
}  // namespace ckpt
