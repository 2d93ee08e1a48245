#!/bin/bash
# nv_sass.sh: builds one kernel of an llmcl family offline for sm_90a and shows its SASS, so that
# registers, spills and the instructions of a hot loop can be read without a GPU. clang's OpenCL
# front end (with libclc's nvptx64 library) stands in for NVIDIA's, the PTX is retargeted to
# sm_90a as program.c does it (the "// @sm90a " markers dropped), and the CUDA toolkit's ptxas,
# cuobjdump and nvdisasm finish the job. clang's PTX is not NVIDIA's: compare variants with it,
# and measure on the device.
#
#   scripts/nv_sass.sh OUT FILES [-DNAME=VALUE ...]
#
# FILES: the family's sources in build order, comma-separated names of src/cl (program.c's
# family table: common, the preludes, the family's files), e.g. for attention's forward:
#
#   scripts/nv_sass.sh /tmp/fwd common,mma,attention_common,attention_portable,attention_mma,\
#       attention_wgmma -DATTN_KERNEL_FWD_WGMMA -DATTN_ONE_KERNEL -DALIGNED4=1 -DBLOCK_M=64 \
#       -DBLOCK_N=64 -DD=64 -DIO_DT=BF16 -DSTAGES=3 -DTMA=1
#
# Writes OUT.cl, OUT.ptx, OUT.cubin and OUT.sass; prints ptxas's report (its C75xx lines say where
# it serialises or waits for wgmma) and the count of each opcode. MAXNREG=R states the entry's
# register count as program.c does for kernels that use setmaxnreg (65536 / work-items, in 8s:
# 168 for 384), which clang's PTX cannot carry. Needs clang-15 and libclc-15 (Debian), and ptxas,
# cuobjdump and nvdisasm (the CUDA toolkit, or pip's nvidia-cuda-nvcc, nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm) in PATH or /usr/local/cuda/bin.
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1
files=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
clang=${CLANG:-clang-15}
libclc=${LIBCLC:-/usr/lib/clc/nvptx64--nvidiacl.bc}
PATH=$PATH:/usr/local/cuda/bin
for tool in "$clang" ptxas cuobjdump nvdisasm; do
    command -v "$tool" > /dev/null || { echo "nv_sass.sh: $tool not found" >&2; exit 1; }
done
[ -f "$libclc" ] || { echo "nv_sass.sh: $libclc not found (libclc-15)" >&2; exit 1; }

: > "$out.cl"
for name in ${files//,/ }; do
    [ -f "$root/src/cl/$name.cl" ] || { echo "nv_sass.sh: no src/cl/$name.cl" >&2; exit 1; }
    [ -s "$out.cl" ] && printf '\n#line 1\n' >> "$out.cl"
    cat "$root/src/cl/$name.cl" >> "$out.cl"
done

# The defines NVIDIA's devices get (program.c); asm is a GNU keyword that clang's OpenCL C lacks.
"$clang" -x cl -cl-std=CL1.2 -target nvptx64--nvidiacl -Xclang -finclude-default-header -O3 -S \
    -Xclang -mlink-bitcode-file -Xclang "$libclc" -Dasm=__asm__ -DLLMCL_NV_PTX -DLLMCL_NV_MMA \
    -DLLMCL_NV_WGMMA -DLLMCL_NV_BF16_CVT "$@" "$out.cl" -o "$out.ptx" 2> "$out.log" ||
    { grep -m 20 error "$out.log" >&2; exit 1; }
sed -i -e 's#// @sm90a ##g' -e 's/^\.target sm_[0-9]*/.target sm_90a/' \
    -e 's/^\.version [0-9.]*/.version 8.7/' "$out.ptx"
# clang states no .reqntid, from which program.c derives the entry's .maxnreg for setmaxnreg.
if [ -n "${MAXNREG:-}" ]; then
    sed -i "/^\.visible \.entry/,/^)/ s/^)$/)\n.maxnreg $MAXNREG/" "$out.ptx"
fi
ptxas -arch=sm_90a -v "$out.ptx" -o "$out.cubin" 2>&1
cuobjdump -sass "$out.cubin" > "$out.sass"
grep -oE '^ +/\*[0-9a-f]{4,5}\*/ +[^;]*' "$out.sass" |
    awk '{ op = $2; if (op ~ /^@/) op = $3; sub(/\..*/, "", op); n[op]++ }
         END { for (op in n) printf "%6d %s\n", n[op], op }' | sort -rn
