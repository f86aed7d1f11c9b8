# One GroupQueryAttention node, CPU EP vs CUDA EP, over variants (packed/separate q,k,v; rotary; binding).
import numpy as np, onnxruntime as ort
from onnx import helper, TensorProto as TP
F16 = TP.FLOAT16
def graph(nh, kvh, hd, packed, rotary, ctx, cos_rows=None, adds=False):
    d = (nh + 2 * kvh) * hd
    ins = [helper.make_tensor_value_info("qkv", F16, [1, "T", d])] if packed else [
        helper.make_tensor_value_info(n, F16, [1, "T", w * hd]) for n, w in (("q", nh), ("k", kvh), ("v", kvh))]
    ins += [helper.make_tensor_value_info(n, F16, [1, kvh, ctx, hd]) for n in ("pk", "pv")]
    ins += [helper.make_tensor_value_info("sk", TP.INT32, [1]), helper.make_tensor_value_info("tot", TP.INT32, [])]
    node_in = (["qkv", "", ""] if packed else ["q", "k", "v"]) + ["pk", "pv", "sk", "tot"]
    inits, pre = [], []
    if adds:  # lengths computed in the graph, as the exporter does (+0 here)
        inits += [helper.make_tensor("z1", TP.INT32, [1], [0]), helper.make_tensor("z0", TP.INT32, [], [0])]
        pre = [helper.make_node("Add", ["sk", "z1"], ["sk2"]), helper.make_node("Add", ["tot", "z0"], ["tot2"])]
        node_in[-2:] = ["sk2", "tot2"]
    if rotary:
        ang = np.arange(cos_rows or ctx)[:, None] * (1e4 ** (-np.arange(0, hd, 2) / hd))[None, :]
        inits += [helper.make_tensor("cos", F16, ang.shape, np.cos(ang).astype(np.float16).tobytes(), raw=True),
                 helper.make_tensor("sin", F16, ang.shape, np.sin(ang).astype(np.float16).tobytes(), raw=True)]
        node_in += ["cos", "sin"]
    n = helper.make_node("GroupQueryAttention", node_in, ["out", "k_out", "v_out"], domain="com.microsoft",
                         num_heads=nh, kv_num_heads=kvh, do_rotary=int(rotary), scale=float(hd ** -0.5))
    outs = [helper.make_tensor_value_info("out", F16, [1, "T", nh * hd])] + [
        helper.make_tensor_value_info(x, F16, [1, kvh, ctx, hd]) for x in ("k_out", "v_out")]
    m = helper.make_model(helper.make_graph(pre + [n], "g", ins, outs, inits),
                          opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()
rng = np.random.default_rng(0)
for nh, kvh, hd in ((4, 2, 16),):
    ctx = 65
    for packed, rotary, cos_rows, adds in ((True, True, 65, False), (True, True, 257, False), (True, True, 65, True), (True, True, 257, True)):
            print("cos_rows", cos_rows, "adds", adds, end=" ")
            m = graph(nh, kvh, hd, packed, rotary, ctx, cos_rows, adds)
            T = 13
            x = (rng.standard_normal((1, T, (nh + 2 * kvh) * hd)) * 0.5).astype(np.float16)
            feeds = {"qkv": x} if packed else {"q": x[..., :nh * hd], "k": x[..., nh * hd:(nh + kvh) * hd], "v": x[..., (nh + kvh) * hd:]}
            feeds.update(sk=np.array([T - 1], np.int32), tot=np.array(T, np.int32))
            res = {}
            for prov in ("CPUExecutionProvider", "CUDAExecutionProvider"):
                s = ort.InferenceSession(m, providers=[prov])
                f = dict(feeds, pk=np.zeros((1, kvh, ctx, hd), np.float16), pv=np.zeros((1, kvh, ctx, hd), np.float16))
                plain = s.run(["out"], f)[0].astype(np.float32)
                b = s.io_binding(); dev = "cuda" if prov.startswith("CUDA") else "cpu"
                bufs = [ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kvh, ctx, hd), np.float16), dev, 0) for _ in range(2)]
                b.bind_output("out", "cpu")
                for k, v in feeds.items():
                    b.bind_cpu_input(k, v)
                b.bind_ortvalue_input("pk", bufs[0]); b.bind_ortvalue_output("k_out", bufs[0])
                b.bind_ortvalue_input("pv", bufs[1]); b.bind_ortvalue_output("v_out", bufs[1])
                s.run_with_iobinding(b)
                shared = b.get_outputs()[0].numpy().astype(np.float32)
                res[prov] = (plain, shared, bufs[0].numpy()[0, :, :T].astype(np.float32))
            c, g = res["CPUExecutionProvider"], res["CUDAExecutionProvider"]
            print(f"hd={hd} packed={packed} rotary={rotary}: |cuda-cpu| plain {np.abs(c[0]-g[0]).max():.4f} "
                  f"shared {np.abs(c[1]-g[1]).max():.4f} kcache {np.abs(c[2]-g[2]).max():.4f}; cpu plain vs shared {np.abs(c[0]-c[1]).max():.4f}", flush=True)
