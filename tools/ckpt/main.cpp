// The `ckpt` program: train a built-in model under a checkpointing strategy, plan a chain under
// a memory budget, or benchmark ckpt against torch.utils.checkpoint. See docs/cli.md.

#include "bench_command.h"
#include "errors.h"
#include "plan_command.h"
#include "train_command.h"

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#ifndef CKPT_VERSION
#define CKPT_VERSION "0.1.0"
#endif

namespace ckpt {
namespace cli {
namespace {

int error(const std::string& message, int code) {
  std::cerr << "ckpt: error: " << message << "\n";
  return code;
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

  if (argc <= 1) {
    std::cerr << app.help();
    return error("a command is required: train, plan or bench", kExitUsage);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      return app.exit(e);  // --help, --version
    }
    const std::string command =
        app.get_subcommands().empty() ? "" : app.get_subcommands().front()->get_name() + " ";
    return error(std::string(e.what()) + " (run 'ckpt " + command + "--help' for usage)",
                 kExitUsage);
  }

  try {
    if (plan->parsed()) return run_plan(plan_args, std::cout);
    if (train->parsed()) return run_train(train_args);
    if (bench->parsed()) return run_bench(bench_args);
  } catch (const UsageError& e) {
    return error(e.what(), kExitUsage);
  } catch (const std::exception& e) {
    return error(e.what(), kExitFailure);
  }
  return error("no command given", kExitUsage);
}

}  // namespace
}  // namespace cli
}  // namespace ckpt

int main(int argc, char** argv) {
  return ckpt::cli::run(argc, argv);
}
