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

#endif /* CACHEBLEND_EXPERIMENTAL_H */
