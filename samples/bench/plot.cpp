// cb_bench --plot: PNG plots drawn by gnuplot.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench.h"

namespace cbbench {

std::string plot_path(const Args& a) {
  auto it = a.values.find("--plot");
  if (it == a.values.end()) return "";
  const std::string& path = it->second;
  if (path.size() < 5 || path.substr(path.size() - 4) != ".png")
    usage_error("option --plot: '" + path + "' is not a .png file name");
  // The directory must take the file (and quality's FILE_tf.png beside it).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const bool exists = ::access(path.c_str(), F_OK) == 0;
  if (::access(exists ? path.c_str() : dir.c_str(), W_OK) != 0)
    runtime_error("option --plot: cannot write '" + path + "': " + std::strerror(errno));
  bool found = false;
  if (const char* env = std::getenv("PATH")) {
    const std::string dirs = env;
    size_t start = 0;
    while (!found) {
      const size_t colon = dirs.find(':', start);
      const std::string dir =
          dirs.substr(start, colon == std::string::npos ? colon : colon - start);
      found = ::access(((dir.empty() ? "." : dir) + "/gnuplot").c_str(), X_OK) == 0;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  if (!found)
    runtime_error(
        "--plot needs gnuplot, which is not on the PATH (Debian: apt-get install gnuplot-nox; "
        "scripts/setup.sh installs it)");
  return path;
}

namespace {

// gnuplot string literal (single quotes; a quote is doubled).
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

}  // namespace

void draw_plot(const std::string& png, const PlotSpec& spec) {
  std::string script = "set terminal pngcairo size 960,600 font 'sans,11'\n";
  script += "set output " + gp_quote(png) + "\n";
  script += "set title " + gp_quote(spec.title) + " noenhanced\n";
  script += "set xlabel " + gp_quote(spec.xlabel) + "\nset ylabel " + gp_quote(spec.ylabel) + "\n";
  script += "set grid\nset key outside right top noenhanced\n";
  script += spec.ymax > 0 ? "set yrange [0:" + cbs::json_number(spec.ymax) + "]\n"
                          : std::string("set yrange [0:*]\n");
  if (spec.logx) script += "set logscale x\n";
  if (!spec.categories.empty()) {
    script += "set xrange [-0.5:" + std::to_string(spec.categories.size() - 0.5) + "]\nset xtics (";
    for (size_t i = 0; i < spec.categories.size(); ++i)
      script += (i ? ", " : "") + gp_quote(spec.categories[i]) + " " + std::to_string(i);
    script += ") noenhanced\n";
  }
  // Inline data blocks: no temporary files to clean up.
  for (size_t i = 0; i < spec.series.size(); ++i) {
    script += "$d" + std::to_string(i) + " << EOD\n";
    for (const auto& [x, y] : spec.series[i].points)
      script += cbs::json_number(x) + " " + cbs::json_number(y) + "\n";
    script += "EOD\n";
  }
  script += "plot ";
  for (size_t i = 0; i < spec.series.size(); ++i)
    script += std::string(i ? ", " : "") + "$d" + std::to_string(i) +
              " using 1:2 with linespoints lw 2 pt 7" + (spec.series[i].dashed ? " dt 2" : "") +
              " title " + gp_quote(spec.series[i].name);
  script += "\n";
  // gnuplot writes the image to stdout when it cannot open the file: never
  // to ours, which carries the JSON lines.
  FILE* gp = ::popen("gnuplot >/dev/null", "w");
  if (gp == nullptr) runtime_error(std::string("cannot run gnuplot: ") + std::strerror(errno));
  std::fwrite(script.data(), 1, script.size(), gp);
  const int status = ::pclose(gp);
  if (status != 0)
    runtime_error("gnuplot failed (status " + std::to_string(status) + ") drawing " + png);
  if (::access(png.c_str(), F_OK) != 0) runtime_error("gnuplot did not write " + png);
  std::fprintf(stderr, "plot written to %s\n", png.c_str());
}

}  // namespace cbbench
