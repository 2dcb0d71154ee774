// The `ckpt` program: train a built-in model under a checkpointing strategy, plan a chain under
// a memory budget, or benchmark ckpt against torch.utils.checkpoint. See docs/cli.md.

#include "bench_command.h"
#include "errors.h"
#include "model_chain.h"
#include "plan_command.h"
#include "train_command.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <exception>
#include <iostream>

#ifndef CKPT_VERSION
#define CKPT_VERSION "0.1.0"
#endif

namespace ckpt {
namespace cli {
namespace {

// Whatever escapes a thread of the program (LibTorch's, Gloo's) ends it the same way: one line.
[[noreturn]] void on_terminate() {
  std::string message = "internal error: the program ended without handling an error";
  if (const std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const c10::Error& e) {
      report_torch_error(e.what(), e.what_without_backtrace());
      std::_Exit(kExitFailure);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "internal error: an exception of an unknown type";
    }
  }
  report_error(message, kExitFailure);
  std::_Exit(kExitFailure);
}

// c10d logs each retry and failure of a connection on stderr, with stack traces; the program
// reports its errors in one line. TORCH_CPP_LOG_LEVEL (LibTorch's switch) brings the logs back.
void quiet_libtorch_logs() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 3;  // fatal
}

// An option given an empty value ("--trace ''") is a mistake in every command: none reads it as
// "not given" or as a default.
void refuse_empty_values(CLI::App& command) {
  const CLI::Validator not_empty(
      [](const std::string& text) { return text.empty() ? "an empty value; give one" : ""; }, "");
  for (CLI::Option* option : command.get_options()) {
    if (option->get_type_size() > 0) option->check(not_empty);
  }
  for (CLI::App* sub : command.get_subcommands({})) refuse_empty_values(*sub);
}

int run(int argc, char** argv) {
  CLI::App app{
      "ckpt: activation checkpointing for LibTorch.\n"
      "Train a built-in transformer with and without checkpointing, plan a chain under a memory "
      "budget, or benchmark ckpt against torch.utils.checkpoint.",
      "ckpt"};
  app.set_version_flag("--version", "ckpt " CKPT_VERSION, "Print the version and exit");
  app.require_subcommand(1);
  app.footer("Run 'ckpt <command> --help' for the options of a command. Reference: docs/cli.md");

  PlanArgs plan_args;
  TrainArgs train_args;
  BenchArgs bench_args;
  CLI::App* plan = add_plan_command(app, plan_args);
  CLI::App* train = add_train_command(app, train_args);
  CLI::App* bench = add_bench_command(app, bench_args);
  refuse_empty_values(app);

  if (argc <= 1) {
    std::cerr << app.help();
    return report_error("a command is required: train, plan or bench", kExitUsage);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      return app.exit(e);  // --help, --version
    }
    const std::string command =
        app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name() + " ";
    return report_error(std::string(e.what()) + " (run 'ckpt " + command + "--help' for usage)",
                        kExitUsage);
  }

  try {
    if (plan->parsed()) return run_plan(plan_args, std::cout, &modeled_bench_chain);
    if (train->parsed()) return run_train(train_args);
    if (bench->parsed()) return run_bench(bench_args);
  } catch (const UsageError& e) {
    return report_error(e.what(), kExitUsage);
  } catch (const c10::Error& e) {
    return report_torch_error(e.what(), e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report_error(e.what(), kExitFailure);
  } catch (...) {
    return report_error("internal error: an exception of an unknown type", kExitFailure);
  }
  return report_error("no command given", kExitUsage);
}

}  // namespace
}  // namespace cli
}  // namespace ckpt

int main(int argc, char** argv) {
  std::set_terminate(ckpt::cli::on_terminate);
  ckpt::cli::quiet_libtorch_logs();
  try {
    return ckpt::cli::run(argc, argv);
  } catch (...) {  // from building the command line, before any command runs
    ckpt::cli::on_terminate();
  }
}
