// How the page (page.mjs) and tests/web/translate.mjs decode with transformers.js 3: the one statement of it in
// JavaScript, the same as the project's Python decoding where transformers.js allows.
//
// Greedy: transformers.js 3's generate() keeps one token a step whatever num_beams says (its beam search is a TODO),
// so the page asks for one beam and says so. One sentence a call: in a batch, transformers.js 3 goes on generating
// for a row past its end token and decodes those tokens too. The output length is the paper's (section 6.1; the
// Python rule is `output_length` in pipeline_vanilla_transformer.py): the length generation_config.json gives, else
// the source's tokens + 50 where the export says `extra_output_tokens` (the model folder set no length; its
// max_length is then only the most the model decodes), at most 4096, and with a learned position table at most its
// rows less the start token's. transformers.js's own fallback, 20 tokens, would cut translations mid-sentence.

export const DECODING = "greedy search (one beam): transformers.js 3 has no beam search";
export const EXTRA_OUTPUT_TOKENS = 50;
export const MAX_OUTPUT_TOKENS = 4096;

/** The new tokens generation_config.json allows (its max_new_tokens, or its max_length less the start token); null
 * where it gives no length. */
export function configuredNewTokens(generationConfig) {
  if (generationConfig?.extra_output_tokens != null) return null;
  if (generationConfig?.max_new_tokens != null) return generationConfig.max_new_tokens;
  if (generationConfig?.max_length != null) return generationConfig.max_length - 1;
  return null;
}

/** The options of a pipeline call on one sentence of `sourceTokens` tokens (its end token included), given the
 * folder's config.json and generation_config.json as plain objects. */
export function generationOptions(sourceTokens, config, generationConfig) {
  const configured = configuredNewTokens(generationConfig);
  const extra = generationConfig?.extra_output_tokens ?? EXTRA_OUTPUT_TOKENS;
  let newTokens = configured ?? Math.min(sourceTokens + extra, MAX_OUTPUT_TOKENS);
  const positions = config?.max_position_embeddings;
  if (config?.position_embedding_type === "learned" && positions != null && newTokens >= positions) {
    newTokens = positions - 1;
  }
  return { num_beams: 1, do_sample: false, max_new_tokens: newTokens };
}

/** The number of tokens the pipeline's tokenizer makes of `text`, cut as the pipeline cuts it. */
export function countTokens(tokenizer, text) {
  return tokenizer(text, { truncation: true }).input_ids.dims.at(-1);
}
