"""A candidate for verify with a scalar decay, as a text edit of the generated source (not part of the
library): the drafts' decays applied to the products' results instead of to their operands, so the
cumulate phase and the barrier after it go.

Verify on tensor cores multiplies the state rows by the drafts' decayed queries and keys, which a
cumulate phase writes (``sh_qd``, ``sh_kd``: q_j e^{G_{n+j}}) between two barriers. With a scalar
decay e^{G_{n+j}} is one number per draft column, so S (q_j e^{G}) = e^{G} (S q_j): the fields write
the undecayed queries and keys in fragment order themselves, and each lane scales its accumulator
columns once after the state products. The last warp sums the drafts' decays by a shuffle scan
(``sh_Gd``), which every reader of G_{n+j} uses (the scores' decay factors, the records' appended
decays, the scaling): the scan adds in another order than the cumulate, so the sums may differ from
its in the last bits, but agree with each other. ``experiment_verify_bounds.py`` times it;
``variant_tests.py`` runs the GPU tests with it.

The generator does this for declarations without a delta rule (``decay_in_products`` in
lowering/render_verify_mma.py), so Mamba-2's verify has no cumulate to edit; this edit remains the
delta rule's candidate (GDN: the keys' fragments scaled too), measured slower there.
"""

from __future__ import annotations

import re

from source_edits import NotApplicable, in_kernel

_STORE = re.compile(r"( *)if \(e < K\) \{ \(sh_key \+ n \* K\)\[j \* K \+ e\] = (\w+)\[i\]; sh_q\[j \* K \+ e\] = (\w+)\[i\]; \}\n")
_CUMULATE = re.compile(r"    for \(int e = tid; e < K; e \+= THREADS\) \{\n        float acc = n \? sh_G\[n - 1\] : 0\.f;\n"
                       r"(?:.*\n)*?    \}\n    __syncthreads\(\);\n")
_SUMS = re.compile(r"        for \(int i = 0; i < 4; \+\+i\) \{ cq\[mt\]\[i\] \+= cqs\[mt\]\[i\];[^\n]*\}\n")
_DECAY_LINE = re.compile(r"        const float (g\d+) = (.*);\n")
_DECAY_STORE = re.compile(r"if \(lane == 0\) \{ sh_g\[j\] = (g\d+);")


def _drafts_sums(fields: str) -> str:
    """The last warp computes every draft's decay on a lane (the fields' decay lines with draft j =
    lane) and their running sums by a shuffle scan into ``sh_Gd`` (G_{n+j} less the buffer's G_{n-1}),
    while the other warps still write the fields; nothing waits for the staged records."""
    lines = _DECAY_LINE.findall(fields)
    last = _DECAY_STORE.search(fields)
    if not lines or last is None:
        raise NotApplicable("decay in the products: the fields' decay lines")
    def on_lane(expr: str) -> str:  # draft j = lane (a token load only for a lane that has a draft), names prefixed
        expr = re.sub(r"\bg(\d+)\b", r"d_g\1", re.sub(r"\bj\b", "lane", expr))
        return f"(lane < t ? {expr} : 0.f)" if "tok_" in expr else expr
    body = "".join(f"        const float d_{name} = {on_lane(expr)};\n" for name, expr in lines)
    return ("    if (warp == WARPS - 1) {  // every draft's decay on a lane, and their running sums\n" + body
            + f"        float acc = lane < t ? d_{last.group(1)} : 0.f;\n"
            "        #pragma unroll\n"
            "        for (int o = 1; o < 32; o <<= 1) { const float y = __shfl_up_sync(0xffffffffu, acc, o); if (lane >= o) acc += y; }\n"
            "        if (lane < t) sh_Gd[lane] = acc;\n    }\n")


PREFIX = ("    const float G_base = n ? sh_G[n - 1] : 0.f;  // G of the buffer's last record\n"
          "    auto G_at = [&](int x) { return x < n ? sh_G[x] : G_base + sh_Gd[x - n]; };  // G of record x\n")


def _decay_in_products(text: str) -> str:
    if "sh_G[NREC * K]" in text or "sh_G[NREC]" not in text:
        raise NotApplicable("decay in the products (a scalar decay only)")
    keys = "sh_kd[" in text
    m = _STORE.search(text)
    cumulate = _CUMULATE.search(text)
    if m is None or cumulate is None or "mma_3xtf32_two(cq[mt]" not in text:
        raise NotApplicable("decay in the products (verify on tensor cores)")
    pad, key, query = m.groups()
    fragments = f"const int y = fragment_slot(j, e); sh_qd[y] = {query}[i];" + (f" sh_kd[y] = {key}[i];" if keys else "")
    text = text[:m.start()] + (f"{pad}if (e < K) {{ (sh_key + n * K)[j * K + e] = {key}[i]; sh_q[j * K + e] = {query}[i]; "
                               f"{fragments} }}\n") + text[m.end():]
    zeros = ("    for (int x = tid; x < (8 - t) * K; x += THREADS) {  // the columns past the drafts\n"
             "        const int y = fragment_slot(t + x / K, x % K);\n"
             "        sh_qd[y] = 0.f;" + (" sh_kd[y] = 0.f;" if keys else "") + "\n    }\n")
    fields_end = text.index("\n    cp_async_wait", m.start()) + 1
    fields_start = text.rindex("    for (int j = warp; j < t; j += WARPS) {\n", 0, m.start())
    text = text[:fields_end] + zeros + _drafts_sums(text[fields_start:fields_end]) + text[fields_end:]
    text = text.replace("    __shared__ float sh_G[NREC];\n", "    __shared__ float sh_G[NREC];\n    __shared__ float sh_Gd[8];\n", 1)
    cumulate = _CUMULATE.search(text)
    text = text[:cumulate.start()] + PREFIX + text[cumulate.end():]
    for old, new in (("expf(sh_G[n + j] - sh_G[rec])", "expf(G_at(n + j) - G_at(rec))"),
                     ("CAPACITY + n + j] = sh_G[n + j];", "CAPACITY + n + j] = G_at(n + j);")):
        if text.count(old) != 1:
            raise NotApplicable(f"decay in the products: {old!r}")
        text = text.replace(old, new, 1)
    sums = _SUMS.search(text)
    if sums is None or len(_SUMS.findall(text)) != 1:
        raise NotApplicable("decay in the products: the state products' sums")
    scale = ("    {\n        const int j0 = 2 * quad, j1 = j0 + 1;  // this lane's draft columns\n"
             "        const float d0 = j0 < t ? expf(G_at(n + j0)) : 0.f, d1 = j1 < t ? expf(G_at(n + j1)) : 0.f;\n"
             "        #pragma unroll\n        for (int mt = 0; mt < MT; ++mt)\n            #pragma unroll\n"
             "            for (int i = 0; i < 4; ++i) { cq[mt][i] *= (i & 1) ? d1 : d0;"
             + (" ck[mt][i] *= (i & 1) ? d1 : d0;" if keys else "") + " }\n    }\n")
    return text[:sums.end()] + scale + text[sums.end():]


DECAY_IN_PRODUCTS = in_kernel("verify", _decay_in_products)
VARIANTS = {"verify: decay in the products": [DECAY_IN_PRODUCTS]}
TEST_LAUNCH = {label: "8x16/r80/f6" for label in VARIANTS}  # verify on tensor cores, as tuned for GDN
PRESETS = {label: ("qwen3.5-4b", "qwen3.5-122b") for label in VARIANTS}  # a scalar decay and the delta rule
