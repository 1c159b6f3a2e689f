// ddprun-bench rendezvous --simulate N,...: the rendezvous protocol's cost against N, with N
// agents simulated in this process (bench/rendezvous_swarm.h) against a real ddprun-store, or
// with --backend etcd-v3 a private etcd (bench/rendezvous_etcd_swarm.h).
// Writes bench/results/rendezvous_simulate.csv and, with gnuplot, a PNG of time and bytes per
// agent against N (log axes), the real-process `form+run` times of rendezvous.csv on it too.
#include "bench/rendezvous_simulate.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/log.h"
#include "bench/paths.h"
#include "bench/rendezvous_etcd_swarm.h"
#include "bench/rendezvous_swarm.h"

namespace ddprun::bench {

namespace {

std::string loadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string l;
  in >> l;
  return l;
}

// The gnuplot script: seconds (left axis) and median bytes per agent (right axis) against N.
void plot(const std::string& csv, const std::string& realCsv, const std::string& png) {
  const std::string script = png + ".gp";
  std::ofstream gp(script);
  gp << "set terminal pngcairo size 900,760\n"
     << "set output '" << png << "'\n"
     << "set datafile separator ','\n"
     << "set logscale xy\nset logscale y2\n"
     << "set xlabel 'agents (N)'\nset ylabel 'seconds'\nset y2label 'bytes per agent (median)'\n"
     << "set ytics nomirror\nset y2tics\nset grid\n"
     // below the axes: inside, the legend covered the points it names; file names print as they are
     << "set key outside below font ',9'\nset termoption noenhanced\n"
     << "set title 'ddprun rendezvous: forming and re-forming a round of N agents'\n"
     << "plot ";
  const char* sep = "";
  for (const char* p : {"log", "slots", "agents", "etcd-agents"}) {
    const std::string sel = "(strcol(1) eq 'simulate-" + std::string(p) + "' ? $2 : 1/0)";
    gp << sep << "'" << csv << "' using " << sel << ":3 every ::1 with linespoints title 'form, "
       << p << " (simulated agents)', \\\n"
       << "     '' using " << sel << ":4 every ::1 with linespoints title 're-form after an "
       << "eviction, " << p << "', \\\n"
       << "     '' using " << sel << ":13 every ::1 axes x1y2 with linespoints dt 2 title "
       << "'bytes per agent, re-form (median), " << p << "'";
    sep = ", \\\n     ";
  }
  if (!realCsv.empty() && std::ifstream(realCsv).good()) {
    gp << ", \\\n     '" << realCsv << "' using (strcol(1) eq 'form+run' ? $2 : 1/0):3 every ::1 "
       << "with points pt 7 ps 1.5 title 'form+run, agent processes ("
       << realCsv.substr(realCsv.rfind('/') + 1) << ")', \\\n     '" << realCsv
       << "' using (strcol(1) eq 'form' ? $2 : 1/0):3 every ::1 with points pt 5 ps 1.2 title "
       << "'form, agent processes'";
  }
  gp << "\n";
  gp.close();
  if (std::system(("gnuplot " + script + " 2>&1").c_str()) != 0)
    std::fprintf(stderr, "gnuplot failed: no plot (%s kept)\n", script.c_str());
  else
    std::remove(script.c_str());
}

}  // namespace

int simulate(const SimulateOptions& o) {
  log::setLevel(log::Level::Warn);  // thousands of agents' "round closed" lines otherwise
  const bool etcd = o.backend == "etcd-v3";
  if (etcd && !etcdInstalled()) {
    std::fprintf(stderr, "ddprun-bench rendezvous --simulate --backend etcd-v3: skipped: %s is not "
                 "installed (Debian etcd-server; scripts/setup installs it)\n", etcdBinary().c_str());
    return 77;
  }
  // The CSV's scenario: the protocol, and etcd when the keys are there.
  auto scenario = [&](const std::string& protocol) {
    return "simulate-" + std::string(etcd ? "etcd-" : "") + protocol +
           (etcd && !o.etcdLeases ? "-no-leases" : "") + (etcd && o.etcdGateway ? "-gateway" : "") +
           (o.waiting > 0 ? "-waiting" : "");
  };
  const std::string csvPath = o.csv.empty() ? resultsPath("rendezvous_simulate.csv") : o.csv;
  // The rows of protocols not run this time are kept from the file (one plot, several runs).
  std::vector<std::string> kept;
  {
    std::ifstream old(csvPath);
    std::string line;
    for (bool header = true; std::getline(old, line); header = false) {
      if (header || line.empty()) continue;
      bool rerun = false;
      for (const auto& p : o.protocols)
        rerun = rerun || line.rfind(scenario(p) + ",", 0) == 0;
      if (!rerun) kept.push_back(line);
    }
  }
  std::ofstream out(csvPath);
  out << "scenario,agents,form_s,reform_s,form_store_cpu_s,reform_store_cpu_s,"
         "form_round_trips_median,form_round_trips_max,form_bytes_median,form_bytes_max,"
         "reform_round_trips_median,reform_round_trips_max,reform_bytes_median,reform_bytes_max,"
         "seed,spread_ms,note\n";
  for (const auto& line : kept) out << line << "\n";
  std::printf("simulated agents against %s (seed %llu, arrivals spread over %lld ms)\n",
              etcd ? ("a private etcd (one member of " + etcdBinary() + ", data in " +
                     o.etcdDataParent + ", " + (o.etcdGateway ? "JSON gateway" : "gRPC") + ")").c_str()
                   : "one ddprun-store",
              static_cast<unsigned long long>(o.seed), static_cast<long long>(o.spread.count()));
  std::printf("%-11s %7s | %8s %8s | %7s %7s | %-17s %-19s | %-17s %-19s | %s\n", "proto", "agents", "form",
              "re-form", "cpu frm", "cpu ref", "form rt med/max", "form bytes med/max",
              "re-form rt med/max", "re-form bytes", "note");
  for (const std::string& protocol : o.protocols) {
  bool stop = false;
  for (int n : o.sizes) {
    std::string note;
    SwarmResult r;
    if (stop) {
      note = "skipped: a smaller N failed or took longer than the cap";
    } else {
      const SwarmOptions so{.agents = n, .seed = o.seed, .spread = o.spread, .maxNproc = 4,
                            .timeout = o.cap, .protocol = protocol, .loops = o.loops,
                            .arrivalRanks = o.arrivalRanks, .waiting = o.waiting};
      try {
        r = etcd ? runEtcdSwarm(so, {.leaseTtl = o.etcdLeaseTtl, .leases = o.etcdLeases, .gateway = o.etcdGateway,
                                   .dataParent = o.etcdDataParent}) : runSwarm(o.storeBinary, so);
      } catch (const std::exception& e) {
        r.error = e.what();
      }
      note = r.error;
      if (protocol == "agents" && !etcd && !o.arrivalRanks)
        note += std::string(note.empty() ? "" : "; ") + "rank order stable";
      if (o.waiting > 0 && r.error.empty()) {
        char b[256];
        std::snprintf(b, sizeof b,
                      "%s%d waiting: on the list in %.3f s, rt %lld / %lld, bytes %lld / %lld "
                      "(median / max); re-form includes them; the evictor rt %lld, bytes %lld",
                      note.empty() ? "" : "; ", o.waiting, r.waitSeconds,
                      (long long)r.wait.medianRoundTrips, (long long)r.wait.maxRoundTrips,
                      (long long)r.wait.medianBytes, (long long)r.wait.maxBytes,
                      (long long)r.evictor.maxRoundTrips, (long long)r.evictor.maxBytes);
        note += b;
      }
      if (r.connectSeconds > 0) {
        char b[96];
        std::snprintf(b, sizeof b, "%sset-up (fibers, connections) %.2f s before the first arrival, not timed",
                      note.empty() ? "" : "; ", r.connectSeconds);
        note += b;
      }
      if (r.formSeconds) {
        char b[96];
        std::snprintf(b, sizeof b, "%sfirst agent done: form %.2f s", note.empty() ? "" : "; ",
                      r.formFirstSeconds);
        note += b;
        if (r.reformSeconds) {
          std::snprintf(b, sizeof b, " / re-form %.2f s", r.reformFirstSeconds);
          note += b;
        }
      }
      if (r.descriptorsFormed > 0) {
        char b[96];
        std::snprintf(b, sizeof b, "%s%lld descriptors open in this process when formed (%.1f per agent)",
                      note.empty() ? "" : "; ", static_cast<long long>(r.descriptorsFormed),
                      static_cast<double>(r.descriptorsFormed) / n);
        note += b;
      }
      if (r.formSwarmCpu > 0) {
        char b[128];
        std::snprintf(b, sizeof b, "%sagents' CPU form %.2f s / re-form %.2f s (%d thread%s)",
                      note.empty() ? "" : "; ", r.formSwarmCpu, r.reformSwarmCpu, o.loops,
                      o.loops == 1 ? "" : "s");
        note += b;
      }
      if (!r.formSeconds || !r.reformSeconds) stop = true;
    }
    note += (note.empty() ? "" : "; ") + std::string("load ") + loadAverage();
    auto num = [](const std::optional<double>& v) {
      char b[32] = "-";
      if (v) std::snprintf(b, sizeof b, "%.3f", *v);
      return std::string(b);
    };
    std::printf("%-11s %7d | %8s %8s | %7.2f %7.2f | %7lld / %-7lld %8lld / %-8lld | %7lld / %-7lld "
                "%8lld / %-8lld | %s\n",
                scenario(protocol).substr(9).c_str(), n, num(r.formSeconds).c_str(), num(r.reformSeconds).c_str(), r.formStoreCpu,
                r.reformStoreCpu, (long long)r.form.medianRoundTrips,
                (long long)r.form.maxRoundTrips, (long long)r.form.medianBytes,
                (long long)r.form.maxBytes, (long long)r.reform.medianRoundTrips,
                (long long)r.reform.maxRoundTrips, (long long)r.reform.medianBytes,
                (long long)r.reform.maxBytes, note.c_str());
    std::fflush(stdout);
    auto cell = [](const std::optional<double>& v) { return v ? std::to_string(*v) : ""; };
    out << scenario(protocol) << "," << n << "," << cell(r.formSeconds) << "," << cell(r.reformSeconds) << ","
        << r.formStoreCpu << "," << r.reformStoreCpu << "," << r.form.medianRoundTrips << ","
        << r.form.maxRoundTrips << "," << r.form.medianBytes << "," << r.form.maxBytes << ","
        << r.reform.medianRoundTrips << "," << r.reform.maxRoundTrips << ","
        << r.reform.medianBytes << "," << r.reform.maxBytes << "," << o.seed << ","
        << o.spread.count() << ",\"" << note << "\"\n";
    out.flush();
  }
  }
  out.close();
  std::printf("\nwritten: %s\n", csvPath.c_str());
  if (!o.png.empty()) {
    plot(csvPath, o.realCsv, o.png);
    std::printf("plot: %s\n", o.png.c_str());
  }
  return 0;
}

}  // namespace ddprun::bench
