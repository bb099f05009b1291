// Translate lines with transformers.js in Node, as a user of the exported folder would: pipeline("translation",
// folder) from local files only, each line alone, decoded as the page decodes (vanilla_transformer/serving/web/
// decoding.mjs). For tests/test_web_export.py.
//
//   node tests/web/translate.mjs NPM_FOLDER MODEL_DIR DTYPE < lines.json > result.json
// NPM_FOLDER: where tests/web/install.sh installed transformers.js; lines.json: a JSON list of strings; the output:
// {"texts": [...], "seconds": [...]}.
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

import { countTokens, generationOptions } from "../../vanilla_transformer/serving/web/decoding.mjs";

const [npmFolder, modelDir, dtype = "fp32"] = process.argv.slice(2);
if (!npmFolder || !modelDir) {
  console.error("usage: node tests/web/translate.mjs NPM_FOLDER MODEL_DIR [DTYPE] < lines.json");
  process.exit(2);
}
const library = join(resolve(npmFolder), "node_modules", "@huggingface", "transformers", "dist", "transformers.node.mjs");
const { env, pipeline } = await import(pathToFileURL(library).href);
env.allowRemoteModels = false;
env.allowLocalModels = true;

const folder = resolve(modelDir);
const readJson = (name, fallback) => {
  try {
    return JSON.parse(readFileSync(join(folder, name), "utf8"));
  } catch (error) {
    if (fallback !== undefined && error.code === "ENOENT") return fallback;
    throw error;
  }
};
const config = readJson("config.json");
const generationConfig = readJson("generation_config.json", {});
const lines = JSON.parse(readFileSync(0, "utf8"));

// one thread: the tests share two cores
const translator = await pipeline("translation", folder, {
  dtype,
  local_files_only: true,
  session_options: { intraOpNumThreads: 1, interOpNumThreads: 1 },
});
const texts = [];
const seconds = [];
for (const line of lines) {
  const options = generationOptions(countTokens(translator.tokenizer, line), config, generationConfig);
  const started = performance.now();
  const [output] = await translator(line, options);
  seconds.push((performance.now() - started) / 1000);
  texts.push(output.translation_text);
}
process.stdout.write(JSON.stringify({ texts, seconds }));
