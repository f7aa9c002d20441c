// Data-parallel training on the UCI digits over MPI, with the gradient compressed by a
// chosen method plus error feedback and exchanged with sidco::comm::sparse_allreducer.
// The model is a libtorch MLP; each rank trains on its shard; every rank applies the same
// averaged update, so the replicas stay identical.
//
//   mpirun -np 4 build/examples/train-digits --method sidco-e --density 0.01 --csv out.csv
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sidco/comm/sparse_allreduce.hpp>
#include <sidco/methods.hpp>
#include <sidco/sidco.hpp>

#ifndef SIDCO_DIGITS_CSV
#define SIDCO_DIGITS_CSV "examples/data/digits/digits.csv"  // from the source tree's root, as the docs run it
#endif

namespace {

struct options {
  std::string method = "sidco-e";
  double density = 0.01;
  int epochs = 15;
  int batch = 16;
  double learning_rate = 0.1;
  unsigned seed = 7;
  bool feedback = true;
  std::string csv;
  std::string data = SIDCO_DIGITS_CSV;
};

struct dataset {
  torch::Tensor x, y;
};

// 64 pixels (0..16) and a label per row; pixels scaled to [0, 1].
dataset load_digits(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw sidco::error("train-digits: cannot open " + path);
  std::vector<float> pixels;
  std::vector<std::int64_t> labels;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::stringstream row(line);
    std::string cell;
    std::vector<float> values;
    while (std::getline(row, cell, ',')) values.push_back(std::stof(cell));
    if (values.size() != 65) throw sidco::error("train-digits: " + path + ": a row without 65 values");
    for (int i = 0; i < 64; ++i) pixels.push_back(values[std::size_t(i)] / 16.f);
    labels.push_back(std::int64_t(values[64]));
  }
  const auto n = std::int64_t(labels.size());
  return {torch::from_blob(pixels.data(), {n, 64}).clone(),
          torch::from_blob(labels.data(), {n}, torch::kInt64).clone()};
}

// Compress the flat gradient into `out`; the residual (error feedback) is per rank.
using compress_fn = std::function<sidco::compress_report(std::span<const float>, double,
                                                         sidco::sparse_vector<float>&,
                                                         sidco::feedback::residual<float>*)>;

template <class Compressor>
compress_fn make(Compressor compressor) {
  auto state = std::make_shared<Compressor>(std::move(compressor));
  return [state](std::span<const float> g, double delta, sidco::sparse_vector<float>& out,
                 sidco::feedback::residual<float>* residual) {
    return residual ? state->template compress<float>(g, delta, out, *residual)
                    : state->template compress<float>(g, delta, out);
  };
}

// Any method of sidco::methods::table; random-k with a shared seed, so that every rank
// picks the same indices. An unknown name is a sidco::error listing the known ones.
compress_fn method_named(const std::string& name, unsigned seed) {
  sidco::methods::options options;
  options.seed = seed;
  return sidco::methods::visit(name, options, [](auto compressor) { return make(std::move(compressor)); });
}

struct mlp : torch::nn::Module {
  mlp() : hidden(register_module("hidden", torch::nn::Linear(64, 128))),
          output(register_module("output", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return output(torch::relu(hidden(x))); }
  torch::nn::Linear hidden, output;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  options opt;
  int status = 0;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw sidco::error("train-digits: " + arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--method") opt.method = value();
      else if (arg == "--density") opt.density = std::stod(value());
      else if (arg == "--epochs") opt.epochs = std::stoi(value());
      else if (arg == "--batch") opt.batch = std::stoi(value());
      else if (arg == "--lr") opt.learning_rate = std::stod(value());
      else if (arg == "--seed") opt.seed = unsigned(std::stoul(value()));
      else if (arg == "--no-feedback") opt.feedback = false;
      else if (arg == "--csv") opt.csv = value();
      else if (arg == "--data") opt.data = value();
      else if (arg == "--help") {
        if (rank == 0)
          std::cout << "usage: mpirun -np P train-digits [--method none|NAME]\n"
                       "       [--density D] [--epochs E] [--batch B] [--lr R] [--seed S]\n"
                       "       [--no-feedback] [--csv FILE] [--data digits.csv]\n"
                       "NAME: " << sidco::methods::all::names() << "\n";
        MPI_Finalize();
        return 0;
      } else {
        throw sidco::error("train-digits: unknown argument '" + arg + "'");
      }
    }
    torch::set_num_threads(1);
    torch::manual_seed(opt.seed);  // the same initial model on every rank

    const dataset all = load_digits(opt.data);
    // A fixed shuffle, 80% train / 20% test; rank r trains on every P-th training example.
    const auto n = all.x.size(0);
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(opt.seed));
    const auto test_size = n / 5;
    std::vector<std::int64_t> shard, test;
    for (std::int64_t i = 0; i < n; ++i) {
      if (i < test_size) test.push_back(order[std::size_t(i)]);
      else if ((i - test_size) % ranks == rank) shard.push_back(order[std::size_t(i)]);
    }
    const auto shard_index = torch::tensor(shard, torch::kInt64);
    const auto test_index = torch::tensor(test, torch::kInt64);
    const torch::Tensor x_train = all.x.index_select(0, shard_index), y_train = all.y.index_select(0, shard_index);
    const torch::Tensor x_test = all.x.index_select(0, test_index), y_test = all.y.index_select(0, test_index);

    auto model = std::make_shared<mlp>();
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(opt.learning_rate));
    std::size_t total = 0;
    for (const auto& p : model->parameters()) total += std::size_t(p.numel());

    const bool dense_baseline = opt.method == "none";
    compress_fn compress = dense_baseline ? compress_fn{} : method_named(opt.method, opt.seed);
    sidco::feedback::residual<float> residual(total);
    sidco::sparse_vector<float> sent;
    sidco::comm::sparse_allreducer<float> allreducer(MPI_COMM_WORLD);
    std::vector<float> flat(total), averaged(total);

    std::ofstream csv;
    if (rank == 0 && !opt.csv.empty()) {
      csv.open(opt.csv);
      if (!csv) throw sidco::error("train-digits: cannot write " + opt.csv);
      csv << "method,ranks,target_density,epoch,train_loss,test_accuracy,achieved_density,"
             "compress_ms_per_step,communicate_ms_per_step\n";
    }
    if (rank == 0)
      std::printf("%-14s %5s %8s %10s %9s %10s %12s %12s\n", "method", "epoch", "density",
                  "train loss", "test acc", "achieved", "compress ms", "comm ms");

    // Every rank takes the same number of steps (the smallest shard's).
    std::int64_t shard_size = x_train.size(0), smallest = 0;
    MPI_Allreduce(&shard_size, &smallest, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    const std::int64_t steps = smallest / opt.batch;
    std::mt19937 batch_rng(opt.seed + unsigned(rank));
    for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
      std::vector<std::int64_t> perm(std::size_t(x_train.size(0)));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), batch_rng);
      double loss_sum = 0, density_sum = 0, compress_s = 0, communicate_s = 0;
      for (std::int64_t step = 0; step < steps; ++step) {
        const auto idx = torch::tensor(std::vector<std::int64_t>(perm.begin() + step * opt.batch,
                                                                 perm.begin() + (step + 1) * opt.batch),
                                       torch::kInt64);
        optimizer.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model->forward(x_train.index_select(0, idx)),
                                                         y_train.index_select(0, idx));
        loss.backward();
        loss_sum += loss.item<double>();
        std::size_t at = 0;
        for (const auto& p : model->parameters()) {
          const auto grad = p.grad().contiguous();
          std::copy(grad.data_ptr<float>(), grad.data_ptr<float>() + grad.numel(), flat.begin() + std::ptrdiff_t(at));
          at += std::size_t(grad.numel());
        }
        if (dense_baseline) {
          const auto start = std::chrono::steady_clock::now();
          MPI_Allreduce(flat.data(), averaged.data(), int(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          for (auto& v : averaged) v /= float(ranks);
          communicate_s += seconds_since(start);
          density_sum += 1;
        } else {
          auto start = std::chrono::steady_clock::now();
          const auto report = compress(flat, opt.density, sent, opt.feedback ? &residual : nullptr);
          compress_s += seconds_since(start);
          density_sum += report.density;
          start = std::chrono::steady_clock::now();
          allreducer.allreduce(sent, opt.density, std::span<float>(averaged));
          communicate_s += seconds_since(start);
        }
        at = 0;
        for (auto& p : model->parameters()) {
          auto grad = p.mutable_grad();
          std::copy(averaged.begin() + std::ptrdiff_t(at), averaged.begin() + std::ptrdiff_t(at + std::size_t(grad.numel())),
                    grad.data_ptr<float>());
          at += std::size_t(grad.numel());
        }
        optimizer.step();
      }
      double epoch_loss = loss_sum / double(steps), mean_loss = 0;
      MPI_Allreduce(&epoch_loss, &mean_loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      mean_loss /= ranks;
      torch::NoGradGuard no_grad;
      const auto predicted = model->forward(x_test).argmax(1);
      const double accuracy = predicted.eq(y_test).to(torch::kFloat64).mean().item<double>() * 100;
      if (rank == 0) {
        const double achieved = density_sum / double(steps);
        const double c_ms = 1e3 * compress_s / double(steps), m_ms = 1e3 * communicate_s / double(steps);
        std::printf("%-14s %5d %8g %10.4f %8.2f%% %10.4g %12.4f %12.4f\n", opt.method.c_str(), epoch,
                    dense_baseline ? 1.0 : opt.density, mean_loss, accuracy, achieved, c_ms, m_ms);
        if (csv)
          csv << opt.method << ',' << ranks << ',' << (dense_baseline ? 1.0 : opt.density) << ',' << epoch
              << ',' << mean_loss << ',' << accuracy << ',' << achieved << ',' << c_ms << ',' << m_ms << '\n';
      }
    }
  } catch (const std::exception& e) {
    if (rank == 0) std::cerr << e.what() << "\n";
    status = 1;
  }
  MPI_Finalize();
  return status;
}
