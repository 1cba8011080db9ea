// rag_assistant: an offline question-answering assistant over local text and
// Markdown files, written against the public C API only (cacheblend.h).
//
//   rag_assistant --store DIR ingest PATH...    chunk, index (FTS5), precompute chunk KV
//   rag_assistant --store DIR ask "QUESTION"    retrieve (BM25), fuse chunk KV, answer
//   rag_assistant --store DIR chat              the same, interactively
//   rag_assistant --store DIR list|status       what the store holds
//   rag_assistant --store DIR remove PATH...    drop files and their chunk KV
//   rag_assistant models                        the known models, and which are here
//   rag_assistant pull NAME|URL                 download a model (resumable, verified)
//
// Exit status: 0 success, 1 error, 2 usage error, 3 nothing relevant found.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "answer.h"
#include "app.h"
#include "ingest.h"
#include "kv_store.h"
#include "long_option.h"
#include "manage.h"
#include "number_arg.h"
#include "printable.h"
#include "pull.h"
#include "ratio_arg.h"

namespace {

const char* const kUsage =
    "usage: rag_assistant --store DIR <command> [options]\n"
    "       rag_assistant models|pull [options]\n"
    "\n"
    "commands:\n"
    "  ingest [PATH...] [--chunk-tokens N] [--max-file-mb M] [--prune] [--system TEXT]\n"
    "      [--kv eager|lazy|background] [--kv-codec C] [--kv-store-mb N]\n"
    "      [--kv-neighbours on|off] [--json]\n"
    "      add documents to the store (folders are walked recursively): Markdown\n"
    "      (.md, .markdown), text (.txt, .text, and files of any other name whose\n"
    "      content is UTF-8 text, such as README), reStructuredText (.rst: its\n"
    "      titles as headings), HTML (.html, .htm: the text, without scripts and\n"
    "      styles, its headings as headings), PDF (.pdf: the text of every page),\n"
    "      and any of these gzip-compressed (.gz: the name without .gz says\n"
    "      which).  They are cut into paragraph-aware chunks of about N tokens\n"
    "      (default: the store's last, else 512), each under the Markdown\n"
    "      headings it sits in, in DIR/corpus.sqlite with a full-text index, and\n"
    "      each chunk's KV precomputed into DIR/kv.  Unchanged files cost nothing;\n"
    "      changed ones replace their chunks; --prune drops stored files that no\n"
    "      longer exist (without it they are still answered from, with a warning).\n"
    "      Binary, empty, corrupt, encrypted or unreadable files, and files over\n"
    "      M MB (default 16; a .gz file's content is measured decompressed, a\n"
    "      PDF's text too), are skipped with a warning naming file and reason.  Without PATH: the\n"
    "      files the store holds (to precompute their KV for another --model or\n"
    "      --system).\n"
    "      --system TEXT: the system prompt of every request, recorded in the\n"
    "      store (default: the store's, else \"Answer the question using the\n"
    "      documents.\"); it is part of each chunk's KV, so a new one computes\n"
    "      every chunk's KV again.\n"
    "      --kv eager|lazy|background  when each chunk's KV is computed: at ingest\n"
    "      (eager, the default); when a question first retrieves the chunk (lazy:\n"
    "      ingest takes seconds, the first questions pay for their chunks); or by a\n"
    "      detached process at idle priority that starts now (background; log in\n"
    "      DIR/precompute.log), while questions may already be asked.\n"
    "      --kv-codec f16|q8|q4 (default q8) and --kv-store-mb N (default 4096): how\n"
    "      chunk KV is stored and how much of it DIR/kv keeps (least recently used\n"
    "      chunks go first); both are kept as the store's settings.  ingest warns\n"
    "      when the corpus's KV would not fit, with its size.\n"
    "      --kv-neighbours on|off (default off; kept as the store's setting): also\n"
    "      compute each chunk's KV after its nearest chunk in the store (BM25 with\n"
    "      the chunk as the query), which questions use where the chunk follows\n"
    "      other chunks.  Experimental: about three times the precompute and\n"
    "      twice the KV, and no gain in answers measured yet.\n"
    "  precompute\n"
    "      compute the KV of every stored chunk that has none yet (after --kv lazy,\n"
    "      or after eviction), one precompute per store at a time.\n"
    "  ask QUESTION [--top-k K] [--mode blend|full|reuse|prefix] [--ratio R|auto]\n"
    "      [--select P] [--chunk-shift on|off] [--context-order best-last|best-first]\n"
    "      [--max-tokens N]\n"
    "      [--temperature T] [--min-p M] [--seed S] [--repeat-penalty X]\n"
    "      [--repeat-last-n N] [--stop TEXT] [--system TEXT] [--min-relevance X]\n"
    "      [--no-diversity] [--retrieve-only] [--json]\n"
    "      retrieve the K best chunks (BM25, default 3), build the request's KV from\n"
    "      their cached KV (blend: recompute a ratio R of the tokens, default 0.2,\n"
    "      chosen by the policy P: lookahead (default), hkvd, hkvd_kv, attention,\n"
    "      random; auto: the loading controller picks R; --chunk-shift off: without\n"
    "      the chunk shift, which is on by default), stream the answer, then\n"
    "      report TTFT (request start to first token; model load not included),\n"
    "      the ratio, chunk-cache hits and misses and the sources (best first).\n"
    "      The chunks enter the request with the best one last, next to the\n"
    "      question, where small models look (--context-order best-first:\n"
    "      retrieval order).\n"
    "      --max-tokens caps the answer (default 160).  --json: one JSON object.\n"
    "      Generation is greedy; --temperature T > 0 samples (with --min-p M and\n"
    "      --seed S); --repeat-penalty X (default 1.2; 1: none) damps the tokens\n"
    "      among the answer's last N (--repeat-last-n, default 64), which stops\n"
    "      answers that repeat themselves; --stop TEXT (may repeat) ends the answer\n"
    "      before that text.  --system TEXT: this question's system prompt instead\n"
    "      of the store's (every chunk's KV is then computed again).\n"
    "      Relevance floor: when no chunk holds at least a share X (default 0.5; 0:\n"
    "      off) of the question's words, weighted by their rarity in the store,\n"
    "      ask prints \"I could not find this in your documents.\", lists no\n"
    "      sources, runs no model and exits with status 3 (--json: \"found\": false).\n"
    "      At most half the K slots (rounded up) go to one file while chunks of\n"
    "      other files match, and a chunk repeating a picked one is skipped\n"
    "      (--no-diversity: plain BM25 order).  --retrieve-only: print the ranked\n"
    "      chunks with their BM25 score and relevance, without loading the model.\n"
    "  chat [same options as ask, no --json]\n"
    "      questions from stdin, one per line (at a terminal: line editing and\n"
    "      history); each is answered like ask.  Ctrl-C stops the current\n"
    "      answer (also while the documents are read); Ctrl-C or Ctrl-D at the\n"
    "      prompt exits.\n"
    "  list [--json]\n"
    "      every stored file: chunks, tokens, how many of its chunks' KV is cached\n"
    "      for the model; then the totals, the KV on disk and the models whose KV\n"
    "      an ingest computed.\n"
    "  remove PATH... [--json]\n"
    "      drop files (a path, a folder, or a name as list shows it) from the store\n"
    "      with their chunks' KV.  A PATH that names no stored file is an error and\n"
    "      nothing is removed.\n"
    "  status [--json]\n"
    "      the store: files, chunks, tokens, the chunk KV store's size and capacity,\n"
    "      the model and whether the store's KV is for it, tiers, read-only state,\n"
    "      chunk tokens and system prompt.\n"
    "  With a model whose KV the store lacks, ask, chat, list and status say so on\n"
    "  stderr (every chunk is then computed: slow) and go on.\n"
    "  models [--models-dir DIR] [--json]\n"
    "      the known models: name, file, size, SHA-256, licence, download URL, and\n"
    "      whether the models directory holds each (DIR, else $CB_MODELS_DIR, else\n"
    "      models/ under the current directory).\n"
    "  pull NAME|URL [--sha256 HEX] [--models-dir DIR] [--force]\n"
    "      download a model by its name in `models` (or any http(s) URL) into the\n"
    "      models directory as FILE.part, then check its SHA-256 (the catalogue's,\n"
    "      or HEX) and only then rename it to FILE; a wrong hash deletes the\n"
    "      download.  A URL with no known hash is downloaded unverified, with a\n"
    "      warning.  An earlier partial download is resumed; Ctrl-C keeps it for\n"
    "      the next pull.  A file already there with the right hash is kept\n"
    "      (--force: download it again).\n"
    "\n"
    "common options:\n"
    "  --store DIR     the store (not needed by models and pull)\n"
    "  --model PATH    GGUF model (default: $CB_MODEL, else the model the store's\n"
    "                  last ingest used while that file exists, else\n"
    "                  models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf here or in the\n"
    "                  source tree); or a name from `models`, looked for in\n"
    "                  $CB_MODELS_DIR, models/ here, then the source tree's models/\n"
    "                  (where the default is looked for too)\n"
    "  --threads N     compute threads (default: the CPU cores available)\n"
    "  --kv-type T     the sessions' KV cache: f16 (default, half the memory) or f32\n"
    "  --help          this text\n"
    "  --version       rag_assistant's and the library's version (no --store needed)\n"
    "\n"
    "storage tiers around DIR/kv (all off by default; give the same to every command):\n"
    "  --ram-budget-mb N        keep up to N MB of chunk KV in RAM in front of DIR/kv\n"
    "  --slow-dir PATH          a slower directory after DIR/kv (an SD card)\n"
    "  --slow-read-mbps X       its read speed cap in MB/s (emulates slow storage)\n"
    "  --redis ADDR             a Redis server shared with other devices, the last tier:\n"
    "                           host:port or redis://[[user]:password@]host[:port][/db];\n"
    "                           every new chunk is also written there\n"
    "  --redis-password P       its password (default: $CB_REDIS_PASSWORD)\n"
    "  --redis-user U           its ACL user (default: $CB_REDIS_USER)\n"
    "  --redis-timeout-ms N     connect and command timeout (default 1000)\n"
    "  --placement-ratio R      the recompute ratio new chunks are placed for (default 0.2):\n"
    "                           the cheapest tier whose reads that much recompute hides\n"
    "  A tier that fails (a server that went away) costs time, never the answer: the\n"
    "  chunks it cannot serve are computed, with a warning on stderr; ask then also\n"
    "  reports each tier's hits.\n"
    "\n"
    "exit status: 0 success, 1 error, 2 usage error, 3 (ask) nothing in the store\n"
    "is relevant to the question\n";

struct UsageError {
  std::string message;
};

[[noreturn]] void usage(const std::string& m) {
  throw UsageError{m};
}

long parse_long(const std::string& flag, const std::string& s, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    usage("option " + flag + ": '" + s + "' is not an integer");
  if (v < lo || v > hi)
    usage("option " + flag + ": " + s + " is outside " + std::to_string(lo) + ".." +
          std::to_string(hi));
  return v;
}

double parse_number(const std::string& flag, const std::string& s, double lo, double hi) {
  double v = 0.0;
  std::string error;
  if (!cbs::parse_number_arg(s, lo, hi, v, error)) usage("option " + flag + ": " + error);
  return v;
}

cb_mode parse_mode(const std::string& s) {
  for (int m = CB_MODE_FULL; m <= CB_MODE_BLEND; ++m)
    if (s == cb_mode_name(static_cast<cb_mode>(m))) return static_cast<cb_mode>(m);
  usage("option --mode: '" + s + "' is not one of blend, full, reuse, prefix");
}

// The policies an app would use (cacheblend.h's); the study baselines of
// the experimental header are cb_bench's.
cb_select parse_select(const std::string& s) {
  for (cb_select p : {CB_SELECT_DEFAULT, CB_SELECT_LOOKAHEAD, CB_SELECT_HKVD, CB_SELECT_HKVD_KV,
                      CB_SELECT_ATTENTION})
    if (s == cb_select_name(p)) return p;
  usage("option --select: '" + s + "' is not one of lookahead, hkvd, hkvd_kv, attention");
}

void parse_ratio(const std::string& s, rag::AskOptions& o) {
  cbs::RatioArg r;
  std::string error;
  if (!cbs::parse_ratio_arg(s, r, error)) usage("option --ratio: " + error);
  o.auto_ratio = r.is_auto;
  if (!r.is_auto) o.ratio = r.value;
}

// The command line as given.  Which options a command accepts is checked
// after parsing, when the command is known: global options may come before
// or after it.
struct CommandLine {
  rag::CommonOptions common;
  rag::IngestOptions ingest;
  rag::AskOptions ask;
  rag::PullOptions pull;
  std::string command, model_flag;
  std::vector<std::string> positional;
  bool threads_given = false, help = false, ratio_given = false, select_given = false;
  bool chunk_shift_given = false;
  bool version = false;
  bool slow_read_given = false, redis_auth_given = false;
  // The options given that only some commands accept.
  std::vector<std::string> ingest_only, ask_only, ask_chat;
  std::vector<std::string> pull_only, model_commands_only;
  std::vector<std::string> system_given;  // ingest, ask and chat
};

// One argument: an option's name (without "=VALUE") and its value, given
// inline ("--flag=VALUE") or as the next argument.
class Arg {
 public:
  Arg(int argc, char** argv, int& i) : name_(argv[i]), argc_(argc), argv_(argv), i_(i) {
    has_inline_ = cbs::split_inline_value(name_, inline_value_);
  }

  const std::string& name() const { return name_; }

  std::string value() {
    if (has_inline_) return inline_value_;
    if (i_ + 1 >= argc_) usage("option " + name_ + " needs a value");
    return argv_[++i_];
  }

  void no_value() const {
    if (has_inline_) usage("option " + name_ + " takes no value");
  }

 private:
  std::string name_;
  int argc_;
  char** argv_;
  int& i_;  // the argument's index; value() moves it past the value
  bool has_inline_ = false;
  std::string inline_value_;
};

// Options every command understands (--system: ingest, ask and chat).
// false when `arg` is none of them.
bool parse_common_option(Arg& arg, CommandLine& cl) {
  const std::string& flag = arg.name();
  rag::CommonOptions& common = cl.common;
  if (flag == "--system") {
    common.system_prompt = arg.value();
    if (common.system_prompt->empty()) usage("option --system needs a non-empty text");
    cl.system_given.push_back(flag);
  } else if (flag == "--store") {
    common.store = arg.value();
    if (common.store.empty()) usage("option --store: empty path");
  } else if (flag == "--model") {
    cl.model_flag = arg.value();
    if (cl.model_flag.empty()) usage("option --model: empty path");
  } else if (flag == "--threads") {
    common.threads = static_cast<int>(parse_long(flag, arg.value(), 1, 512));
    cl.threads_given = true;
  } else if (flag == "--kv-type") {
    const std::string t = arg.value();
    if (t != "f16" && t != "f32") usage("option --kv-type: expected f16 or f32, got '" + t + "'");
    common.kv_type = t == "f32" ? CB_KV_F32 : CB_KV_F16;
  } else {
    return false;
  }
  return true;
}

// The storage tiers' options; false when `arg` is none of them.
bool parse_tier_option(Arg& arg, CommandLine& cl) {
  const std::string& flag = arg.name();
  rag::TierOptions& tiers = cl.common.tiers;
  if (flag == "--ram-budget-mb") {
    tiers.ram_budget_bytes = static_cast<uint64_t>(parse_long(flag, arg.value(), 1, 1 << 20)) << 20;
  } else if (flag == "--slow-dir") {
    tiers.slow_dir = arg.value();
    if (tiers.slow_dir.empty()) usage("option --slow-dir: empty path");
  } else if (flag == "--slow-read-mbps") {
    tiers.slow_read_bytes_per_sec =
        static_cast<uint64_t>(parse_number(flag, arg.value(), 0.001, 1e6) * 1e6);
    cl.slow_read_given = true;
  } else if (flag == "--redis") {
    tiers.redis_address = arg.value();
    if (tiers.redis_address.empty()) usage("option --redis: empty address");
  } else if (flag == "--redis-password") {
    tiers.redis_password = arg.value();
    cl.redis_auth_given = true;
  } else if (flag == "--redis-user") {
    tiers.redis_username = arg.value();
    cl.redis_auth_given = true;
  } else if (flag == "--redis-timeout-ms") {
    tiers.redis_timeout_ms = static_cast<int>(parse_long(flag, arg.value(), 1, 600000));
    cl.redis_auth_given = true;
  } else if (flag == "--placement-ratio") {
    tiers.placement_ratio = static_cast<float>(parse_number(flag, arg.value(), 0.0, 1.0));
  } else {
    return false;
  }
  return true;
}

// ingest's options; false when `arg` is none of them.
bool parse_ingest_option(Arg& arg, CommandLine& cl) {
  const std::string& flag = arg.name();
  rag::IngestOptions& ingest = cl.ingest;
  if (flag == "--chunk-tokens") {
    ingest.chunk_tokens = static_cast<size_t>(parse_long(flag, arg.value(), 16, 8192));
  } else if (flag == "--max-file-mb") {
    ingest.max_file_bytes = static_cast<uint64_t>(parse_long(flag, arg.value(), 1, 4096)) << 20;
  } else if (flag == "--kv") {
    const std::string v = arg.value();
    const auto when = rag::parse_kv_when(v);
    if (!when) usage("option --kv: '" + v + "' is not eager, lazy or background");
    ingest.kv = *when;
  } else if (flag == "--kv-codec") {
    const std::string v = arg.value();
    const auto codec = rag::parse_codec(v);
    if (!codec) usage("option --kv-codec: '" + v + "' is not f16, q8 or q4");
    ingest.codec = *codec;
  } else if (flag == "--kv-neighbours") {
    const std::string v = arg.value();
    if (v != "on" && v != "off") usage("option --kv-neighbours: '" + v + "' is not on or off");
    ingest.neighbours = v == "on";
  } else if (flag == "--kv-store-mb") {
    ingest.capacity_bytes = static_cast<uint64_t>(parse_long(flag, arg.value(), 16, 1L << 30))
                            << 20;
  } else if (flag == "--prune") {
    arg.no_value();
    ingest.prune = true;
  } else {
    return false;
  }
  cl.ingest_only.push_back(flag);
  return true;
}

// How ask and chat answer: retrieval, the mode and generation.  false
// when `arg` is none of these.
bool parse_ask_option(Arg& arg, CommandLine& cl) {
  const std::string& flag = arg.name();
  rag::AskOptions& ask = cl.ask;
  if (flag == "--repeat-last-n") {
    ask.repeat_last_n = static_cast<int>(parse_long(flag, arg.value(), 0, 8192));
  } else if (flag == "--top-k") {
    ask.top_k = static_cast<int>(parse_long(flag, arg.value(), 1, 64));
  } else if (flag == "--mode") {
    ask.mode = parse_mode(arg.value());
  } else if (flag == "--ratio") {
    parse_ratio(arg.value(), ask);
    cl.ratio_given = true;
  } else if (flag == "--select") {
    ask.select = parse_select(arg.value());
    cl.select_given = true;
  } else if (flag == "--chunk-shift") {
    const std::string v = arg.value();
    if (v != "on" && v != "off") usage("option --chunk-shift: '" + v + "' is not on or off");
    ask.chunk_shift = v == "on" ? 1 : 0;
    cl.chunk_shift_given = true;
  } else if (flag == "--context-order") {
    const std::string v = arg.value();
    if (v != "best-last" && v != "best-first")
      usage("option --context-order: '" + v + "' is not best-last or best-first");
    ask.best_last = v == "best-last";
  } else if (flag == "--max-tokens") {
    ask.max_tokens = static_cast<int>(parse_long(flag, arg.value(), 1, 8192));
  } else if (flag == "--temperature") {
    ask.temperature = static_cast<float>(parse_number(flag, arg.value(), 0.0, 100.0));
  } else if (flag == "--min-p") {
    ask.min_p = static_cast<float>(parse_number(flag, arg.value(), 0.0, 0.999));
  } else if (flag == "--repeat-penalty") {
    ask.repeat_penalty = static_cast<float>(parse_number(flag, arg.value(), 0.01, 100.0));
  } else if (flag == "--seed") {
    ask.seed = static_cast<uint64_t>(parse_long(flag, arg.value(), 0, 1LL << 62));
  } else if (flag == "--stop") {
    ask.stops.push_back(arg.value());
    if (ask.stops.back().empty()) usage("option --stop needs a non-empty text");
  } else if (flag == "--min-relevance") {
    ask.min_relevance = parse_number(flag, arg.value(), 0.0, 1.0);
  } else if (flag == "--no-diversity") {
    arg.no_value();
    ask.diversity = false;
  } else if (flag == "--retrieve-only") {
    arg.no_value();
    ask.retrieve_only = true;
  } else {
    return false;
  }
  cl.ask_chat.push_back(flag);
  return true;
}

// models' and pull's options; false when `arg` is none of them.
bool parse_model_command_option(Arg& arg, CommandLine& cl) {
  const std::string& flag = arg.name();
  rag::PullOptions& pull = cl.pull;
  if (flag == "--models-dir") {
    pull.models_dir = arg.value();
    if (pull.models_dir.empty()) usage("option --models-dir: empty path");
    cl.model_commands_only.push_back(flag);
  } else if (flag == "--sha256") {
    pull.sha256 = arg.value();
    if (!rag::is_sha256_hex(pull.sha256))
      usage("option --sha256: '" + pull.sha256 + "' is not 64 hexadecimal digits");
    cl.pull_only.push_back(flag);
  } else if (flag == "--force") {
    arg.no_value();
    pull.force = true;
    cl.pull_only.push_back(flag);
  } else {
    return false;
  }
  return true;
}

// Any option; false when `arg` is none of them (a command, an argument or
// an unknown option).
bool parse_option(Arg& arg, CommandLine& cl) {
  if (arg.name() == "--help" || arg.name() == "-h") {
    cl.help = true;
  } else if (arg.name() == "--version") {
    arg.no_value();
    cl.version = true;
  } else if (arg.name() == "--json") {
    arg.no_value();
    cl.ingest.json = cl.ask.json = true;
    cl.ask_only.push_back(arg.name());  // and ingest: checked later
  } else {
    return parse_common_option(arg, cl) || parse_tier_option(arg, cl) ||
           parse_ingest_option(arg, cl) || parse_ask_option(arg, cl) ||
           parse_model_command_option(arg, cl);
  }
  return true;
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    Arg arg(argc, argv, i);
    if (parse_option(arg, cl)) continue;
    if (arg.name().rfind("--", 0) == 0) usage("unknown option '" + arg.name() + "'");
    if (cl.command.empty())
      cl.command = arg.name();
    else
      cl.positional.push_back(arg.name());
  }
  return cl;
}

// models and pull: no store, no model.
int run_model_command(const CommandLine& cl) {
  const std::string& command = cl.command;
  if (!cl.system_given.empty()) usage("option --system is for ingest, ask and chat");
  if (!cl.ingest_only.empty() || !cl.ask_chat.empty())
    usage("option " + (cl.ingest_only.empty() ? cl.ask_chat : cl.ingest_only).front() +
          " is not for " + command);
  if (command == "models") {
    if (!cl.pull_only.empty()) usage("option " + cl.pull_only.front() + " is for pull only");
    if (!cl.positional.empty()) usage("models takes no arguments");
    return rag::run_models({cl.pull.models_dir, cl.ask.json});
  }
  if (cl.ask.json) usage("option --json is not for pull");
  if (cl.positional.size() != 1)
    usage("pull takes one NAME or URL (rag_assistant models lists the names)");
  rag::PullOptions pull = cl.pull;
  pull.target = cl.positional[0];
  return rag::run_pull(pull);
}

// A usage error for a command of the store that is unknown, or given an
// option it does not take.
void check_store_command(const CommandLine& cl) {
  const std::string& command = cl.command;
  if (!cl.model_commands_only.empty())
    usage("option " + cl.model_commands_only.front() + " is for models and pull only");
  if (!cl.pull_only.empty()) usage("option " + cl.pull_only.front() + " is for pull only");
  const bool manage = command == "list" || command == "remove" || command == "status";
  if (command != "ingest" && command != "ask" && command != "chat" && command != "precompute" &&
      !manage)
    usage("unknown command '" + command +
          "' (expected ingest, ask, chat, precompute, list, remove, status, models or pull)");
  if (cl.common.store.empty()) usage("--store DIR is required");
  if (command != "ingest" && !cl.ingest_only.empty())
    usage("option " + cl.ingest_only.front() + " is for ingest only");
  if ((command == "ingest" || command == "precompute" || manage) && !cl.ask_chat.empty())
    usage("option " + cl.ask_chat.front() + " is for ask and chat only");
  if ((manage || command == "precompute") && !cl.system_given.empty())
    usage("option --system is for ingest, ask and chat");
  if ((command == "chat" || command == "precompute") && !cl.ask_only.empty())
    usage("option --json is not for " + command);
  if (command == "chat" && cl.ask.retrieve_only) usage("option --retrieve-only is for ask only");
  if (cl.ratio_given && cl.ask.mode != CB_MODE_BLEND)
    usage("option --ratio applies to --mode blend only");
  if (cl.select_given && cl.ask.mode != CB_MODE_BLEND)
    usage("option --select applies to --mode blend only");
  if (cl.chunk_shift_given && cl.ask.mode != CB_MODE_BLEND)
    usage("option --chunk-shift applies to --mode blend only");
  if (cl.ask.auto_ratio && cl.ask.mode != CB_MODE_BLEND)
    usage("--ratio auto applies to --mode blend only");

  if (cl.slow_read_given && cl.common.tiers.slow_dir.empty())
    usage("option --slow-read-mbps needs --slow-dir");
  if (cl.redis_auth_given && cl.common.tiers.redis_address.empty())
    usage("options --redis-password, --redis-user and --redis-timeout-ms need --redis");
}

// The Redis tier's password and user not given as options, from the
// environment, so a password need not appear in the process list.
void redis_auth_from_environment(rag::TierOptions& tiers) {
  if (tiers.redis_address.empty()) return;
  const char* pw = std::getenv("CB_REDIS_PASSWORD");
  if (tiers.redis_password.empty() && pw != nullptr) tiers.redis_password = pw;
  const char* user = std::getenv("CB_REDIS_USER");
  if (tiers.redis_username.empty() && user != nullptr) tiers.redis_username = user;
}

// The commands of a store, once checked and with the model resolved.
int run_store_command(CommandLine& cl) {
  const std::string& command = cl.command;
  const std::vector<std::string>& positional = cl.positional;
  if (command == "ingest") {
    cl.ingest.paths = positional;  // none: the store's own files
    return rag::run_ingest(cl.common, cl.ingest);
  }
  if (command == "list" || command == "status") {
    if (!positional.empty()) usage(command + " takes no arguments");
    return command == "list" ? rag::run_list(cl.common, cl.ask.json)
                             : rag::run_status(cl.common, cl.ask.json);
  }
  if (command == "remove") {
    if (positional.empty()) usage("remove needs at least one PATH");
    return rag::run_remove(cl.common, positional, cl.ask.json);
  }
  if (command == "ask") {
    if (positional.size() != 1)
      usage(positional.empty() ? "ask needs a QUESTION"
                               : "ask takes one QUESTION (quote it: ask \"...\")");
    return rag::run_ask(cl.common, cl.ask, positional[0]);
  }
  if (command == "precompute") {
    if (!positional.empty()) usage("precompute takes no arguments");
    return rag::run_precompute(cl.common);
  }
  if (!positional.empty()) usage("chat takes no arguments (questions come from stdin)");
  return rag::run_chat(cl.common, cl.ask);
}

int run(int argc, char** argv) {
  CommandLine cl = parse_command_line(argc, argv);
  if (cl.help || cl.command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cl.version) return rag::run_version();
  if (cl.command.empty())
    usage("no command given (ingest, ask, chat, precompute, list, remove, status, models or pull)");
  if (cl.command == "models" || cl.command == "pull") return run_model_command(cl);
  check_store_command(cl);
  redis_auth_from_environment(cl.common.tiers);

  if (!cl.threads_given) cl.common.threads = rag::available_cores();
  // Retrieval alone needs no model.
  if (!cl.ask.retrieve_only || cl.command != "ask")
    cl.common.model_path = rag::resolve_model_path(cl.model_flag, cl.common.store);
  return run_store_command(cl);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "rag_assistant: error: %s (see rag_assistant --help)\n",
                 e.message.c_str());
    return 2;
  } catch (const rag::Error& e) {
    std::fprintf(stderr, "rag_assistant: error: %s\n", cbs::printable(e.what()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "rag_assistant: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rag_assistant: error: %s\n", cbs::printable(e.what()).c_str());
    return 1;
  }
}
