// cb_bench: the on-device benchmark, written against the public C API only.
//
//   cb_bench generate --prompt TEXT [--chat] --max-tokens N   text and speed
//   cb_bench prefill  --tokens N [--repeat K]                  prefill speed
//   cb_bench decode   --tokens N [--ctx N]                     decode speed
//   cb_bench ttft     --chunks N --chunk-tokens T ...          RAG TTFT per mode
//   cb_bench quality  --dataset FILE ...                       RAG answer quality per mode
//
// With --json every subcommand prints one JSON object per line.
// Exit status: 0 success, 1 runtime error, 2 usage error.
#include <cstdio>
#include <exception>
#include <new>

#include "bench.h"

namespace {

const char* const kUsage =
    "usage: cb_bench <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate --prompt TEXT [--chat] [--system TEXT] [--max-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S]\n"
    "           [--repeat-penalty X] [--repeat-last-n N] [--stop TEXT]...\n"
    "      generate text from a prompt (with --chat: a user turn in the model's\n"
    "      chat template); prints the text, then timings on stderr.  Greedy by\n"
    "      default.\n"
    "      --max-tokens defaults to 128.  --repeat-penalty (default 1: none)\n"
    "      damps the tokens of the last N generated (default 64); --stop (may\n"
    "      repeat) ends the text before the first stop string.\n"
    "  prefill --tokens N [--repeat K]\n"
    "      prefill speed over N tokens of a fixed English text; reports the\n"
    "      median (and best) of K runs (default 3) after one warm-up.\n"
    "  decode --tokens N [--ctx C] [--repeat K]\n"
    "      decode speed: N greedy tokens after a prompt of C tokens (default 16);\n"
    "      median of K runs (default 1).\n"
    "  ttft --chunks N --chunk-tokens T [--query-tokens Q] [--ratio R|auto[,R2,...]]\n"
    "       [--modes full,prefix,reuse,blend] [--repeat K] [--chunk-head prompt|none]\n"
    "       [--codec f32|f16|q8|q4] [--store DIR] [--storage-mbps B[,B2,...]]\n"
    "       [--pipeline on|off] [--fetch-threads N] [--select P[,P2,...]] [--sink-tokens K]\n"
    "       [--chunk-shift on|off] [--shift-probes X] [--shift-span T] [--plot FILE.png]\n"
    "      time to first token of a RAG request of N distinct chunks of about T\n"
    "      tokens each (cut from a built-in English text) and a question of about\n"
    "      Q tokens (default 32).  The chunk cache is warmed first (an untimed\n"
    "      blend request computes every chunk, a second reads them back), so timed\n"
    "      runs find their chunks in RAM, as in deployment (on a discrete GPU in\n"
    "      its memory: see --resident-kv-mb).  Each mode (blend: each ratio,\n"
    "      default 0.2) runs\n"
    "      K times (default 3) on a reset session, the runs of all modes and\n"
    "      ratios (and, for blend, each --select policy) interleaved; TTFT = the\n"
    "      RAG prefill plus sampling the first\n"
    "      token; the median is reported.  With --ratio auto, one untimed auto\n"
    "      request first lets the loading controller calibrate.  Several read caps\n"
    "      (--storage-mbps 50,200,1000; a chunk store on flash) run every mode and\n"
    "      ratio once per cap.  --plot FILE.png draws TTFT per mode against the\n"
    "      read cap (several caps), else against the ratio (several ratios), else\n"
    "      per mode (needs gnuplot).  --pipeline off loads each layer just before\n"
    "      it computes; --fetch-threads N reads the chunks of a layer on N threads\n"
    "      (default 0: the library's choice, 1 on the CPU, up to 4 on a GPU).\n"
    "  ttft --tiers ram,flash,slow,tiered [--ram-budget-mb M] [--slow-mbps S]\n"
    "       [--redis ADDR] [--placement-ratio R] [--codec f16|q8|q4] (and the options above\n"
    "       but --store and --storage-mbps)\n"
    "      the same request against several chunk stores, side by side, runs\n"
    "      interleaved: ram (every chunk in RAM, f32: the baseline), flash (a store\n"
    "      in a temporary directory, --codec, default f16), slow (the same capped\n"
    "      at S MB/s, default 10) and tiered (a RAM tier of M MB, then flash, then\n"
    "      a directory capped at S MB/s, then the Redis server at ADDR if given;\n"
    "      new chunks placed for --placement-ratio, default the first --ratio).\n"
    "      Each store is warmed by two untimed blend requests (one computes and\n"
    "      places the chunks, one reads them back).  Reports TTFT against the ram\n"
    "      store's (vs_ram), the first token's KL divergence from the ram store's\n"
    "      and from full prefill's, whether the logits are bitwise the flash\n"
    "      store's (=flash), and each tier's hits per request.  Default modes:\n"
    "      full,blend.\n"
    "  quality [--dataset FILE] [--limit N] [--max-chunks K] [--ratio R|auto[,R2,...]]\n"
    "          [--modes full,prefix,reuse,blend] [--chunk-head prompt|none]\n"
    "          [--max-tokens M] [--codec C] [--store DIR] [--show] [--plot FILE.png]\n"
    "          [--select P[,P2,...]] [--schedule L:R[,L:R...]] [--sink-tokens K]\n"
    "          [--chunk-shift on|off] [--shift-probes X] [--shift-span T]\n"
    "          [--seed S] [--guard-share X] [--guard-max-ratio Y] [--tf-tokens T]\n"
    "          [--neighbour-context similar|outside|store|unrelated] [--neighbours K]\n"
    "          [--context-scale S]\n"
    "      answer quality on a dataset (--dataset, else $CB_DEV_DATA): a JSON\n"
    "      list of {question, answers[], ctxs[{title, text}]} (e.g. a MuSiQue dev\n"
    "      split: scripts/musique_dataset.py writes one); each ctx is one\n"
    "      chunk (title + newline + text), the first K of them (default all); the\n"
    "      first N examples (default all).  Per example, full prefill runs first\n"
    "      (the reference; always run), then the other modes, on a reset session\n"
    "      and one shared chunk cache.  Greedy answers of at most M tokens\n"
    "      (default 12), stopped at end of generation or a newline.  Per mode:\n"
    "      f1 (SQuAD token F1 against the best gold answer), fidelity_f1 (F1\n"
    "      against full prefill's answer), top1_agree and kl_first (the first\n"
    "      token's argmax and KL(full || mode) against full prefill) and the\n"
    "      median TTFT; teacher-forced fidelity: full prefill's greedy answer of\n"
    "      T tokens (default 32) is fed after each mode's prefill, and kl_tf_mean\n"
    "      (mean KL(full || mode) over its positions) and top1_tf (share of\n"
    "      positions whose argmax agrees) compare every position; exact_answer\n"
    "      is the share of answers identical to full prefill's; gap_closed (and\n"
    "      gap_closed_tf) = 1 - KL(mode) / KL(reuse) on the same examples (reuse\n"
    "      always runs when blend does); request_tokens_median is the requests'\n"
    "      median length (prompt head, chunks and question).  TTFT is always\n"
    "      taken on a cached run: a mode whose run had to compute missing chunks\n"
    "      is run again and that run is measured (and scored; the answer is the\n"
    "      same).  Progress goes to stderr; --show prints every answer there\n"
    "      too, with its first-token and teacher-forced KL.\n"
    "      Blend runs once per ratio and --select policy (hkvd, hkvd_kv,\n"
    "      attention, lookahead, random, oracle, oracle_kl; default: the\n"
    "      library's), or with\n"
    "      --schedule (check layers, e.g. 1:0.3,3:0.15) instead of --ratio.\n"
    "      --sink-tokens K recomputes each chunk's first K tokens too;\n"
    "      --chunk-shift off keeps the reused KV of the tokens not recomputed as\n"
    "      stored (default on: they take the mean correction of their chunk's\n"
    "      recomputed tokens); --shift-probes X gives that share of the count\n"
    "      (default 0.25) to evenly spread tokens that measure the correction;\n"
    "      --shift-span T also cuts each chunk into spans of about T tokens, a\n"
    "      token taking half its chunk's correction and half its span's (default\n"
    "      the library's; 0: the chunk's alone);\n"
    "      --seed S seeds random; --guard-share X with\n"
    "      --guard-max-ratio Y raises the ratio (up to Y) until the selected\n"
    "      tokens hold X of the policy's score.\n"
    "      With several blend runs --plot FILE.png draws KL(first token) against\n"
    "      the computed fraction per policy, and FILE_tf.png top1_tf likewise.\n"
    "      --codec f32 (default: chunk KV in RAM) | f16 | q8 | q4 (chunk KV in a\n"
    "      chunk store on flash: --store DIR, else a temporary directory removed at\n"
    "      exit); --storage-mbps B caps the store's reads at B MB/s (slow flash).\n"
    "      With --store or --storage-mbps and no --codec: f16.\n"
    "      --neighbour-context (a study of neighbour-aware precompute): every\n"
    "      chunk but the first is computed after another ctx instead of alone, in\n"
    "      a cache namespace of the example's: similar, the example's ctx (any of\n"
    "      them, not only the first K) sharing most words of 4+ letters with it;\n"
    "      outside, the same among the ctxs past the first K; store, the nearest of\n"
    "      every loaded example's ctxs by BM25 over words of 4+ letters (what a\n"
    "      chunk store's index picks; --neighbours K: after its K nearest, the\n"
    "      nearest last); unrelated, a ctx of the next example (a control).\n"
    "      --context-scale S (default 1: off) weighs the attention that the\n"
    "      question and the answer pay to reused chunks by S against the other\n"
    "      keys' in reuse and blend runs (cb_chunk_cache_set_context_scale).\n"
    "\n"
    "common options:\n"
    "  --model PATH     GGUF model (default: $CB_MODEL, else\n"
    "                   models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf here or in\n"
    "                   the source tree)\n"
    "  --threads N      compute threads (default: the number of CPU cores available\n"
    "                   to this process)\n"
    "  --backend B      cpu, cuda or auto (default: auto = cuda when the library\n"
    "                   has CUDA and a GPU is present, else cpu); on the CPU the\n"
    "                   kernels are the best the CPU has, or the level that\n"
    "                   $CB_CPU_KERNELS names (avx512, avx2-vnni, avx2,\n"
    "                   neon-dotprod, neon or scalar)\n"
    "  --device N       the CUDA device for --backend cuda|auto (default 0)\n"
    "  --chat-template T  auto (default: the family the model's template names),\n"
    "                   chatml, llama3 or gemma: how --chat and RAG requests are\n"
    "                   laid out\n"
    "  --n-ctx N        session context size in tokens (default: what the command\n"
    "                   needs, at most the model's context; generate: min(model\n"
    "                   context, 4096))\n"
    "  --kv-type T      the session's KV cache: f16 (default, half the memory) or\n"
    "                   f32 (exact)\n"
    "  --activations A  int8 (default: weight products take int8 activations, as\n"
    "                   llama.cpp's; 2-3x faster prefill on x86) or f32\n"
    "                   (exact)\n"
    "  --n-batch N      tokens per forward chunk of a prefill or a blend's layers\n"
    "                   (default 256 on the CPU, 2048 on CUDA); fewer take less\n"
    "                   activation memory\n"
    "  --resident-kv-mb N  GPU memory (MiB) for chunks' KV kept between requests\n"
    "                   (default: the library's, a sixteenth of a discrete GPU's\n"
    "                   memory, at most 4 GiB; none on the CPU); 0: none, so that\n"
    "                   every request reads its chunks from the chunk cache\n"
    "  --json           print one JSON object per line instead of text\n"
    "  --help           this text\n"
    "\n"
    "exit status: 0 success, 1 error, 2 usage error\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace cbbench;
  try {
    const Args a = parse_args(argc, argv);
    if (a.command == "help" || a.switches.count("--help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a.command == "generate") return cmd_generate(a);
    if (a.command == "prefill") return cmd_prefill(a);
    if (a.command == "ttft") return cmd_ttft(a);
    if (a.command == "quality") return cmd_quality(a);
    return cmd_decode(a);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cb_bench: error: %s (see cb_bench --help)\n", e.message.c_str());
    return 2;
  } catch (const RuntimeError& e) {
    std::fprintf(stderr, "cb_bench: error: %s\n", e.message.c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "cb_bench: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cb_bench: error: %s\n", e.what());
    return 1;
  }
}
