"""The exported page's time per sentence in headless Chromium: `export-onnx --web --assets` served on 127.0.0.1
(cross-origin isolated, so that ONNX Runtime's WebAssembly may use threads), driven through the page's
`window.translateAll` on the first --sentences Multi30k test sentences, at each of --threads and --dtypes. The first
sentence of each run is a warm-up, left out. Seconds are the page's own clock around each pipeline call (one sentence
a call, greedy, as the page translates).

Needs Debian's chromium and chromium-driver, and selenium (the dev extra).

Usage:
    vanilla-transformer export-onnx MODEL_DIR /tmp/web --quantize q8 --web --assets NPM/node_modules/@huggingface/transformers/dist
    python benchmarks/web_page_speed.py /tmp/web --sentences 100
"""

import argparse
import functools
import json
import shutil
import statistics
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import describe_machine, machine, read_lines, uptime  # noqa: E402

SENTENCES = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en.gz"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


class IsolatedFiles(SimpleHTTPRequestHandler):
    """A static server of one folder with the headers of a cross-origin isolated page."""

    extensions_map = {
        **SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
    }

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, format, *arguments):
        pass


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    driver.set_script_timeout(3600)
    return driver


def run(driver, url: str, lines: list[str], threads: int, dtype: str) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{url}index.html?threads={threads}")
    WebDriverWait(driver, 300).until(lambda d: d.execute_script("return document.body.dataset.ready === 'true'"))
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.translateAll(arguments[0], arguments[1]).then(done, (error) => done({error: String(error)}));",
        lines,
        {"dtype": dtype, "device": "wasm"},
    )
    if "error" in result:
        raise SystemExit(f"the page failed: {result['error']}")
    seconds = result["seconds"][1:]
    return {
        "threads": threads,
        "page_threads": result.get("threads"),
        "dtype": dtype,
        "sentences": len(seconds),
        "median_ms": statistics.median(seconds) * 1000,
        "mean_ms": statistics.fmean(seconds) * 1000,
        "sentences_per_second": len(seconds) / sum(seconds),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir", help="an export written with --web --assets")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "q8"])
    parser.add_argument("--output", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    info = machine()
    print(describe_machine(info), "\nbefore:", uptime(), flush=True)
    lines = read_lines(SENTENCES, args.sentences + 1)  # the first is the warm-up
    handler = functools.partial(IsolatedFiles, directory=str(Path(args.export_dir).resolve()))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    driver, rows = browser(), []
    try:
        for threads in args.threads:
            for dtype in args.dtypes:
                rows.append(run(driver, f"http://127.0.0.1:{server.server_address[1]}/", lines, threads, dtype))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        driver.quit()
        server.shutdown()
    print("after:", uptime())
    print("| threads | precision | sentences | median ms | mean ms | sentences/s |\n|---:|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['page_threads']} | {row['dtype']} | {row['sentences']} | {row['median_ms']:.0f} "
            f"| {row['mean_ms']:.0f} | {row['sentences_per_second']:.1f} |"
        )
    if args.output:
        Path(args.output).write_text(json.dumps({"machine": info, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
