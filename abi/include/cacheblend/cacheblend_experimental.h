/* cacheblend-rt: the experimental part of the C API.
 *
 * What this header adds is for studies of the method, not for applications:
 * baselines and oracles that show what a selection policy is worth (the
 * oracles run a full prefill first, so they are slower than CB_MODE_FULL).
 * It carries no compatibility promise: any of it may change or go in any
 * release, unlike cacheblend.h.  Include it after, or instead of,
 * cacheblend.h. */
#ifndef CACHEBLEND_EXPERIMENTAL_H
#define CACHEBLEND_EXPERIMENTAL_H

#include "cacheblend/cacheblend.h"

/* More values of cb_select (cb_rag_options.select):
 *   RANDOM     a seeded uniform pick (cb_rag_options.seed): the floor a policy
 *              must beat at the same count of tokens;
 *   ORACLE     the tokens whose reused KV deviates most from a full prefill's,
 *              over all layers;
 *   ORACLE_KL  the blocks of 16 reused tokens whose KV from a full prefill, put
 *              in place of the reused KV, most lowers the last token's KL
 *              against the full prefill (a full prefill and a question pass
 *              per block first): an upper bound for ranking policies. */
#define CB_SELECT_RANDOM ((cb_select)5)
#define CB_SELECT_ORACLE ((cb_select)6)
#define CB_SELECT_ORACLE_KL ((cb_select)7)

/* Neighbour-aware precompute: as cb_chunk_cache_add, but the chunk's KV is
 * computed after its chunk head followed by context_text's tokens (its most
 * similar chunk, say) instead of after the chunk head alone, and stored as
 * the chunk's KV after a context, replacing an earlier one (one per chunk,
 * whatever the context).  A request takes it for the chunk wherever the
 * chunk follows other chunks, in preference to the KV computed alone; where
 * the chunk opens the request with the PROMPT chunk head, whose KV the
 * request takes as exact, it takes the KV computed alone (computing it on a
 * miss) instead.  Requests look for it only once this cache object has
 * stored such KV, or after cb_chunk_cache_set_neighbour_kv(cache, 1) (a
 * store on flash or Redis that an earlier process filled): other caches
 * pay no second lookup per chunk.  cb_chunk_cache_contains reports the KV
 * computed alone, cb_chunk_cache_contains_after the KV computed after a
 * context (arguments and errors as cb_chunk_cache_contains);
 * cb_chunk_cache_remove removes both.  Errors as
 * cb_chunk_cache_add; the chunk with its head and context must fit in the
 * session's context.
 *
 * cb_chunk_cache_set_neighbour_kv: whether requests through `cache` look
 * for KV computed after a context (1) or not (0, the default until
 * cb_chunk_cache_add_after stores some through it).
 * CB_ERR_INVALID_ARGUMENT for a NULL cache or another value. */
/* Context scale (APE's scaling factor): in REUSE and BLEND requests through
 * this cache, the question's rows and every token decoded after them weigh
 * their attention to the reused chunks' keys by `scale` against the other
 * keys' (the prompt head, the question, the answer); the recomputed chunk
 * tokens attend as before.  It adds no recompute.  Whether a scale helps,
 * and which, depends on the model: fit it on development data (in
 * docs/FIDELITY.md, 0.6 helped SmolLM2-135M, and no scale from 0.45 to 0.8
 * helped the Qwen2.5-Coder models); 1 (the default) leaves attention as it
 * is.  Set it before the cache's requests run.  CB_ERR_INVALID_ARGUMENT for
 * a NULL cache or a scale outside [0.01, 100]. */
#ifdef __cplusplus
extern "C" {
#endif

CB_API cb_status cb_chunk_cache_set_context_scale(cb_chunk_cache* cache, float scale);

CB_API cb_status cb_chunk_cache_set_neighbour_kv(cb_chunk_cache* cache, int32_t enabled);

CB_API cb_status cb_chunk_cache_add_after(cb_session* session, cb_chunk_cache* cache,
                                          const char* chunk_text, const char* context_text,
                                          const cb_rag_options* opts, int32_t* out_n_tokens);

CB_API cb_status cb_chunk_cache_contains_after(const cb_model* model, cb_chunk_cache* cache,
                                               const char* chunk_text, const cb_rag_options* opts,
                                               int32_t* out_found);

#ifdef __cplusplus
}
#endif

#endif /* CACHEBLEND_EXPERIMENTAL_H */
