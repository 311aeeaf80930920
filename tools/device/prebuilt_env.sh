# Sourced on the GPU machine (see pack_prebuilt.sh): unpacks .pre/*.xz (or *.gz) into $PRE_BIN (/tmp/fp4moe_pre),
# unpacks .pre/lib into $PRE_BIN/lib and puts it on LD_LIBRARY_PATH, points SWEEP_BIN / FP4MOE_BIN at the carried fp4moe and sets
# FP4MOE_COMMIT. Test binaries find the goldens and fp4moe through the paths compiled into them
# (FP4MOE_SOURCE_DIR, FP4MOE_BINARY_DIR of the machine that built them): those are linked here.
PRE_BIN=${PRE_BIN:-/tmp/fp4moe_pre}
mkdir -p "$PRE_BIN"
for z in .pre/*.xz .pre/*.gz; do
  [ -e "$z" ] || continue
  b=$(basename "${z%.*}")
  case "$z" in *.xz) xz -dc "$z" ;; *) gunzip -c "$z" ;; esac > "$PRE_BIN/$b" && chmod +x "$PRE_BIN/$b"
done
# The shared libraries travel as .pre/lib/*.xz (pack_prebuilt.sh; plain files from older packs
# work too): unpacked beside the binaries.
mkdir -p "$PRE_BIN/lib"
for z in .pre/lib/*; do
  [ -e "$z" ] || continue
  case "$z" in *.xz) xz -dc "$z" > "$PRE_BIN/lib/$(basename "${z%.xz}")" ;; *) cp -f "$z" "$PRE_BIN/lib/" ;; esac
done
export PRE_BIN LD_LIBRARY_PATH="$PRE_BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SWEEP_BIN="$PRE_BIN/fp4moe" FP4MOE_BIN="$PRE_BIN/fp4moe" FP4MOE_COMMIT=$(cat .pre/COMMIT 2>/dev/null || echo unknown)
src_dir=$(cat .pre/SOURCE_DIR 2>/dev/null || echo /work/main)
for d in tests models; do  # the goldens and the trained model (models/glm5-mini-py) the tests read
  if [ "$src_dir" != "$PWD" ] && [ ! -e "$src_dir/$d" ]; then
    mkdir -p "$src_dir" && ln -sfn "$PWD/$d" "$src_dir/$d"
  fi
done
# The tests that run the CLI look for it in FP4MOE_BINARY_DIR/bin (also when the checkout sits
# at the same path here: build/ is not carried).
[ -x "$src_dir/build/bin/fp4moe" ] || { mkdir -p "$src_dir/build/bin" && cp "$PRE_BIN/fp4moe" "$src_dir/build/bin/fp4moe"; }
