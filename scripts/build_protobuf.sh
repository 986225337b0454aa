#!/usr/bin/env bash
# Builds the private protobuf-lite runtime and generates our ONNX message classes.
#
# Why not just link the system protobuf:
#   * libtorch_cpu.so exports ~259 google::protobuf symbols of ANOTHER protobuf version; if our
#     extension linked the system libprotobuf.so dynamically, the two would interpose each other's
#     symbols and crash or misparse. So we link protobuf statically and hide it
#     (-fvisibility=hidden at compile time, -Wl,--exclude-libs,ALL at every final .so link).
#   * Debian's libprotobuf-lite.a is not PIC (R_X86_64_TPOFF32 when linked into a .so), so we
#     rebuild it from Debian's own source package (same version as Debian's /usr/bin/protoc, so
#     the generated code matches the headers) with -fPIC.
#   * Two libraries in one process that register "onnx/onnx.proto" abort with "File already
#     exists in database". We generate from the onnx package's own onnx.proto under a private
#     package (torch_ort_onnx) and file name; the wire format does not depend on either.
#
# Outputs (all under build/, ignored by git):
#   build/third_party/protobuf-lite/{include,lib/libprotobuf-lite.a}
#   build/generated/torch_ort_onnx.{proto,pb.h,pb.cc}   -> C++ namespace torch_ort_onnx
# Idempotent: a finished build is detected by a stamp file; generation is skipped when the
# rewritten proto is unchanged (so timestamps, and hence ninja, stay quiet).
# Env overrides: PYTHON (to locate onnx), ONNX_PROTO (path to onnx.proto), JOBS (default 2).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TP="$ROOT/build/third_party"
PREFIX="$TP/protobuf-lite"
GEN="$ROOT/build/generated"
PROTOC=/usr/bin/protoc
JOBS="${JOBS:-2}"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
log() { echo "[build_protobuf] $*"; }
die() { echo "[build_protobuf] error: $*" >&2; exit 1; }

# --- Debian's protoc: its version decides which protobuf source we build.
if [ ! -x "$PROTOC" ]; then
  log "installing protobuf-compiler"
  $SUDO apt-get install -y --no-install-recommends protobuf-compiler
fi
PB_VERSION="$("$PROTOC" --version | awk '{print $2}')"  # "libprotoc 3.21.12" -> 3.21.12
[ "$PB_VERSION" = 3.21.12 ] || log "warning: protoc is $PB_VERSION, script was written for 3.21.12"
STAMP="$PREFIX/.built-$PB_VERSION-pic-hidden"

fetch_source() {
  # apt-get source needs a deb-src entry; add one for the running Debian release if missing.
  local list=/etc/apt/sources.list.d/torch-ort-src.sources
  if [ ! -f "$list" ]; then
    local codename
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
    log "adding deb-src entry $list ($codename main)"
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$codename" | $SUDO tee "$list" >/dev/null
    $SUDO apt-get update -qq
  fi
  command -v dpkg-source >/dev/null || $SUDO apt-get install -y --no-install-recommends dpkg-dev
  mkdir -p "$TP/src" && cd "$TP/src"
  if ! ls protobuf_"$PB_VERSION"*.dsc >/dev/null 2>&1; then
    # Prefer the exact Debian revision of the installed protoc; fall back to the newest source.
    local rev
    rev="$(dpkg-query -W -f='${Version}' protobuf-compiler 2>/dev/null || true)"
    apt-get source --download-only "protobuf${rev:+=$rev}" 2>/dev/null ||
      { $SUDO apt-get update -qq; apt-get source --download-only protobuf; }
  fi
  local dsc
  dsc="$(ls protobuf_"$PB_VERSION"*.dsc 2>/dev/null | tail -1)"
  [ -n "$dsc" ] || die "Debian source for protobuf $PB_VERSION not found (got: $(ls))"
  rm -rf "protobuf-$PB_VERSION"
  dpkg-source --no-check -x "$dsc" "protobuf-$PB_VERSION" >/dev/null  # applies Debian's patches
}

build_lite() {
  local src="$TP/src/protobuf-$PB_VERSION" bld="$TP/build/protobuf-lite"
  local launcher=()
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  rm -rf "$bld" "$PREFIX"
  cmake -S "$src" -B "$bld" -G Ninja "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_CXX_VISIBILITY_PRESET=hidden -DCMAKE_VISIBILITY_INLINES_HIDDEN=ON \
    -DCMAKE_CXX_FLAGS="-fvisibility=hidden" \
    -Dprotobuf_BUILD_TESTS=OFF -Dprotobuf_BUILD_PROTOC_BINARIES=OFF \
    -Dprotobuf_BUILD_LIBPROTOC=OFF -Dprotobuf_BUILD_SHARED_LIBS=OFF \
    -Dprotobuf_WITH_ZLIB=OFF -Dprotobuf_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$bld" --target libprotobuf-lite -j "$JOBS"
  # Install only the lite library and the headers (the full libprotobuf is never built).
  cmake --install "$bld" --component libprotobuf-lite >/dev/null
  cmake --install "$bld" --component protobuf-headers >/dev/null
  [ -f "$PREFIX/lib/libprotobuf-lite.a" ] || die "libprotobuf-lite.a was not installed"
  touch "$STAMP"
}

find_onnx_proto() {
  if [ -n "${ONNX_PROTO:-}" ]; then echo "$ONNX_PROTO"; return; fi
  local py="${PYTHON:-}"
  if [ -z "$py" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then py="$ROOT/.venv/bin/python"; else py=python3; fi
  fi
  "$py" -c 'import os, onnx; print(os.path.join(os.path.dirname(onnx.__file__), "onnx.proto"))' ||
    die "cannot import onnx with $py; pip install onnx, or set PYTHON or ONNX_PROTO"
}

generate() {
  local proto tmp
  proto="$(find_onnx_proto)"
  [ -f "$proto" ] || die "onnx.proto not found at $proto"
  mkdir -p "$GEN"
  tmp="$GEN/.torch_ort_onnx.proto.tmp"
  # Only the package changes; LITE_RUNTIME is added when the file does not already ask for it.
  sed -e 's/^package onnx;/package torch_ort_onnx;/' "$proto" >"$tmp"
  grep -q '^package torch_ort_onnx;' "$tmp" || die "no 'package onnx;' line in $proto"
  grep -q '^option optimize_for = LITE_RUNTIME;' "$tmp" ||
    printf '\noption optimize_for = LITE_RUNTIME;\n' >>"$tmp"
  if cmp -s "$tmp" "$GEN/torch_ort_onnx.proto" && [ -f "$GEN/torch_ort_onnx.pb.cc" ] &&
     [ -f "$GEN/torch_ort_onnx.pb.h" ]; then
    rm -f "$tmp"; log "generated classes up to date"; return
  fi
  mv "$tmp" "$GEN/torch_ort_onnx.proto"
  "$PROTOC" --proto_path="$GEN" --cpp_out="$GEN" "$GEN/torch_ort_onnx.proto"
  log "generated $GEN/torch_ort_onnx.pb.{h,cc} from $proto"
}

if [ -f "$STAMP" ] && [ -f "$PREFIX/lib/libprotobuf-lite.a" ]; then
  log "protobuf-lite $PB_VERSION already built in $PREFIX"
else
  log "building protobuf-lite $PB_VERSION (PIC, hidden visibility) into $PREFIX"
  fetch_source
  build_lite
fi
generate
