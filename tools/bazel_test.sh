#!/usr/bin/env bash
# Runs the Bazel test targets offline with Debian's bazel-bootstrap (Bazel 4.2.3),
# installing it with apt-get when missing (CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bazel >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bazel_test: installing Debian's bazel-bootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap >/dev/null
  else
    echo "bazel_test: bazel not found; install Debian's bazel-bootstrap (apt-get install bazel-bootstrap)" >&2
    exit 1
  fi
fi
test -x .venv/bin/python || { echo "bazel_test: run 'make install' first (.venv missing)" >&2; exit 1; }
status=0
bazel test //tests/... "$@" || status=$?
bazel shutdown >/dev/null 2>&1 || true
exit $status
