// The page's script (index.html): the model folder the page sits in, loaded from the page's own URL by transformers.js's
// translation pipeline, translating each line typed, one at a time, and timing each. Written by
// `vanilla-transformer export-onnx --web` (vanilla_transformer/serving/web_page.py), which fills in SETTINGS: where
// transformers.js and ONNX Runtime's WebAssembly files come from (its CDN, or the folder's assets/), and the
// precisions whose files the folder holds.
import { DECODING, countTokens, generationOptions } from "./decoding.mjs";

const SETTINGS = "__PAGE_SETTINGS__";
const MODEL = "."; // the folder the page is in: transformers.js fetches ./config.json, ./onnx/..., relative to the page
const PRECISION_NAMES = { fp32: "float32", fp16: "float16", q8: "int8 (q8)" };

const { pipeline, env } = await import(new URL(SETTINGS.library, import.meta.url).href);
env.allowRemoteModels = false; // the model is this folder's, never the Hub's
env.allowLocalModels = true;
env.useBrowserCache = false; // a folder exported again at the same address must not be served from Cache Storage
if (SETTINGS.wasmPaths) env.backends.onnx.wasm.wasmPaths = new URL(SETTINGS.wasmPaths, import.meta.url).href;
const threads = Number(new URLSearchParams(location.search).get("threads"));
if (Number.isInteger(threads) && threads > 0) env.backends.onnx.wasm.numThreads = threads;

const readJson = async (name) => {
  const response = await fetch(new URL(name, location.href));
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return response.json();
};
const [config, generationConfig] = await Promise.all([
  readJson("config.json"),
  readJson("generation_config.json").catch(() => ({})),
]);

const loaded = new Map(); // "dtype/device" -> Promise of a pipeline
let webgpu = null;

async function hasWebGPU() {
  if (webgpu === null) {
    try {
      webgpu = Boolean(navigator.gpu && (await navigator.gpu.requestAdapter()));
    } catch {
      webgpu = false;
    }
  }
  return webgpu;
}

function load(dtype, device) {
  const key = `${dtype}/${device}`;
  if (!loaded.has(key)) {
    const started = performance.now();
    const made = pipeline("translation", MODEL, { dtype, device, local_files_only: true }).then((translator) => ({
      translator,
      loadSeconds: (performance.now() - started) / 1000,
    }));
    made.catch(() => loaded.delete(key));
    loaded.set(key, made);
  }
  return loaded.get(key);
}

/** The pipeline for `dtype` on `device` ("auto": WebGPU where the browser has it, else WebAssembly), falling back to
 * WebAssembly where WebGPU fails; with the device it runs on and why, where it fell back. */
async function translatorFor(dtype, device) {
  if (!SETTINGS.precisions.includes(dtype)) {
    throw new Error(`This folder has no ${dtype} model: it has ${SETTINGS.precisions.join(", ")}.`);
  }
  let note = "";
  if (device === "auto") device = (await hasWebGPU()) ? "webgpu" : "wasm";
  else if (device === "webgpu" && !(await hasWebGPU())) {
    device = "wasm";
    note = "this browser has no WebGPU adapter";
  }
  if (device === "webgpu") {
    try {
      return { ...(await load(dtype, "webgpu")), device, note };
    } catch (error) {
      device = "wasm";
      note = `WebGPU failed (${error.message ?? error})`;
    }
  }
  return { ...(await load(dtype, "wasm")), device, note };
}

/** Translate `lines`, each alone, as the page does: the texts, the seconds each took (blank lines stay blank, 0 s),
 * and how (device, precision, threads, decoding). For scripts and tests: `await window.translateAll(lines, options)`. */
async function translateAll(lines, { dtype = SETTINGS.precisions[0], device = "auto" } = {}) {
  const { translator, loadSeconds, device: used, note } = await translatorFor(dtype, device);
  const texts = [];
  const seconds = [];
  for (const line of lines) {
    if (line.trim() === "") {
      texts.push("");
      seconds.push(0);
      continue;
    }
    const options = generationOptions(countTokens(translator.tokenizer, line), config, generationConfig);
    const started = performance.now();
    const [output] = await translator(line, options);
    seconds.push((performance.now() - started) / 1000);
    texts.push(output.translation_text);
  }
  return {
    texts,
    seconds,
    dtype,
    device: used,
    note,
    threads: used === "wasm" ? env.backends.onnx.wasm.numThreads : null,
    crossOriginIsolated: self.crossOriginIsolated,
    decoding: DECODING,
    loadSeconds,
    version: SETTINGS.version,
  };
}
window.translateAll = translateAll;

// --- the page ---------------------------------------------------------------------------------------------------
const $ = (id) => document.getElementById(id);
for (const dtype of SETTINGS.precisions) $("precision").add(new Option(PRECISION_NAMES[dtype] ?? dtype, dtype));
$("decoding").textContent = `Decoding: ${DECODING}; at most the source's length + 50 tokens.`;
$("library").textContent = `transformers.js ${SETTINGS.version}, ${SETTINGS.wasmPaths ? "from this folder" : "from its CDN"}`;

function describe(result) {
  const where = result.device === "webgpu" ? "WebGPU" : `WebAssembly, ${result.threads} thread${result.threads === 1 ? "" : "s"}`;
  const isolation = result.device === "wasm" && !result.crossOriginIsolated
    ? " (one thread: the server sends no cross-origin isolation headers)" : "";
  const fallback = result.note ? `; ${result.note}, so WebAssembly` : "";
  return `${where}${isolation}${fallback}, ${PRECISION_NAMES[result.dtype] ?? result.dtype}; loaded in ${result.loadSeconds.toFixed(1)} s`;
}

async function onTranslate() {
  const lines = $("source").value.split("\n");
  $("translate").disabled = true;
  $("status").textContent = "Loading the model and translating...";
  try {
    const result = await translateAll(lines, { dtype: $("precision").value, device: $("device").value });
    $("target").value = result.texts.join("\n");
    const timed = result.seconds.filter((_, index) => lines[index].trim() !== "");
    const mean = timed.reduce((sum, value) => sum + value, 0) / Math.max(timed.length, 1);
    $("times").replaceChildren(...result.seconds.map((value, index) => {
      const row = document.createElement("li");
      row.textContent = lines[index].trim() === "" ? "(blank)" : `${(value * 1000).toFixed(0)} ms`;
      return row;
    }));
    $("status").textContent = `${timed.length} sentence${timed.length === 1 ? "" : "s"}, ${(mean * 1000).toFixed(0)} ms a sentence on average. ${describe(result)}.`;
  } catch (error) {
    $("status").textContent = `Error: ${error.message ?? error}`;
  } finally {
    $("translate").disabled = false;
  }
}
$("translate").addEventListener("click", onTranslate);
$("translate").disabled = false;
$("status").textContent = "Ready.";
document.body.dataset.ready = "true";
