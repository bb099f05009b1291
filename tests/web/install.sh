#!/usr/bin/env bash
# Install transformers.js (the npm package @huggingface/transformers, at the version the exported page pins:
# TRANSFORMERS_JS_VERSION in vanilla_transformer/serving/web_page.py) and the ONNX Runtime packages it depends on
# (onnxruntime-node for Node, onnxruntime-web for browsers) into FOLDER, for tests/test_web_export.py: Node runs
# tests/web/translate.mjs with it, and FOLDER/node_modules/@huggingface/transformers/dist is the --assets folder of the
# page tested in Chromium. Install scripts are not run: onnxruntime-node's would download CUDA libraries from GitHub
# on a machine with nvcc (its CPU library is in the package), and the others only check what is already there.
#
#   tests/web/install.sh FOLDER
set -euo pipefail
folder=${1:?usage: tests/web/install.sh FOLDER}
here=$(cd "$(dirname "$0")" && pwd)
version=$(sed -n 's/^TRANSFORMERS_JS_VERSION = "\(.*\)"$/\1/p' "$here/../../vanilla_transformer/serving/web_page.py")
[ -n "$version" ] || { echo "no TRANSFORMERS_JS_VERSION in vanilla_transformer/serving/web_page.py" >&2; exit 1; }
mkdir -p "$folder"
npm install --prefix "$folder" --no-audit --no-fund --ignore-scripts --save-exact --loglevel=error \
    "@huggingface/transformers@$version"
