#include "tools/run_device.hpp"

#include <attnjit/attnjit.hpp>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <iostream>
#include <optional>
#include <utility>

#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/npy.hpp"

namespace attnjit::cli {
namespace {

// x in dtype dt; `overflows` (if given) counts the finite values that became infinite.
std::vector<uint8_t> encode(const std::vector<float>& x, DType dt, int64_t* overflows = nullptr) {
  std::vector<uint8_t> out(x.size() * static_cast<size_t>(dtype_bytes(dt)));
  const uint16_t inf = dt == DType::F16 ? 0x7c00 : 0x7f80;  // the exponent all ones, no mantissa
  for (size_t n = 0; n < x.size(); ++n) {
    if (dt == DType::F32) {
      std::memcpy(out.data() + 4 * n, &x[n], 4);
      continue;
    }
    if (dt == DType::E4M3) {  // the values of codes (cmd_run quantises): exact
      out[n] = float_to_e4m3(x[n]);
      continue;
    }
    const uint16_t h = dt == DType::F16 ? float_to_half(x[n]) : float_to_bfloat16(x[n]);
    if (overflows && (h & 0x7fff) == inf && std::isfinite(x[n])) ++*overflows;
    std::memcpy(out.data() + 2 * n, &h, 2);
  }
  return out;
}

// Says once, with the counts, that some inputs became inf in dtype dt; the run goes on.
void warn_overflows(DType dt, const std::vector<std::pair<const char*, int64_t>>& counts) {
  int64_t total = 0;
  std::string each;
  for (const auto& [name, n] : counts) {
    total += n;
    if (n > 0) each += (each.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(n);
  }
  if (total == 0) return;
  const bool half = dt == DType::F16;
  std::cerr << "warning: --dtype " << (half ? "fp16" : "bf16") << ": " << total << " input value" << (total == 1 ? "" : "s")
            << " (" << each << ") lie outside " << (half ? "fp16" : "bf16") << "'s finite range (largest "
            << (half ? "65504" : "3.39e38") << ") and became inf; scale the inputs or use "
            << (half ? "bf16 or fp32" : "fp32") << "\n";
}

std::vector<float> decode(const std::vector<uint8_t>& b, DType dt) {
  std::vector<float> out(b.size() / static_cast<size_t>(dtype_bytes(dt)));
  for (size_t n = 0; n < out.size(); ++n) {
    if (dt == DType::F32) {
      std::memcpy(&out[n], b.data() + 4 * n, 4);
    } else if (dt == DType::E4M3) {
      out[n] = e4m3_to_float(b[n]);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * n, 2);
      out[n] = dt == DType::F16 ? half_to_float(h) : bfloat16_to_float(h);
    }
  }
  return out;
}

// The tensors' memory on the device: GPU memory through the driver, host memory for the emulator.
class DeviceBytes {
public:
  DeviceBytes(bool gpu, size_t bytes) : gpu_(gpu) {
    if (gpu_) dev_ = DeviceBuffer(bytes);
    else host_.resize(bytes);
  }
  void* data() { return gpu_ ? reinterpret_cast<void*>(dev_.get()) : static_cast<void*>(host_.data()); }
  void upload(const std::vector<uint8_t>& b) {
    if (gpu_) copy_to_device(dev_.get(), b.data(), b.size());
    else host_ = b;
  }
  void download(void* out, size_t bytes) {
    if (gpu_) copy_to_host(out, dev_.get(), bytes);
    else std::memcpy(out, host_.data(), bytes);
  }

private:
  bool gpu_;
  DeviceBuffer dev_;
  std::vector<uint8_t> host_;
};

}  // namespace

void run_on_device(const Device& device, const Pattern& p, const Shape& s, const std::vector<float>& q,
                   const std::vector<float>& k, const std::vector<float>& v, const DynamicLayout* dynamic, DType dtype,
                   const KernelConfig& config, std::vector<float>& o, std::vector<float>& lse, DeviceBackward* backward,
                   std::vector<float>* weights, const std::vector<int64_t>* documents, const DeviceFp8* fp8) {
  const bool gpu = device.kind == DeviceKind::CUDA;
  RuntimeOptions ro;
  ro.device = device;
  ro.config = config;
  Runtime rt(ro);
  const DType out_dtype = fp8 ? fp8->out_dtype : dtype;  // O's (and dO's, dQ's ...: no FP8 backward)
  const Problem pb{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, dtype,
                   fp8 ? std::optional<DType>(out_dtype) : std::nullopt};
  Attention op = rt.prepare(p, pb);
  auto upload = [&](const std::vector<float>& x, int64_t* overflows) {
    const std::vector<uint8_t> bytes = encode(x, dtype, overflows);
    DeviceBytes b(gpu, bytes.size());
    b.upload(bytes);
    return b;
  };
  int64_t q_over = 0, k_over = 0, v_over = 0, do_over = 0;
  DeviceBytes dq = upload(q, &q_over), dk = upload(k, &k_over), dv = upload(v, &v_over);
  std::optional<DeviceBytes> ddo;
  if (backward) ddo.emplace(upload(backward->dout, &do_over));
  warn_overflows(dtype, {{"q", q_over}, {"k", k_over}, {"v", v_over}, {"dO", do_over}});
  const std::vector<int64_t> os{s.batch, s.seq_q, s.heads_q, s.head_dim_v};
  std::vector<uint8_t> obytes(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v * dtype_bytes(out_dtype)));
  DeviceBytes dout(gpu, obytes.size()), dlse(gpu, static_cast<size_t>(s.batch * s.heads_q * s.seq_q) * sizeof(float));
  auto view = [&](DeviceBytes& b, DType dt, std::vector<int64_t> shape) { return TensorView::contiguous(b.data(), dt, std::move(shape)); };
  const TensorView lse_view = view(dlse, DType::F32, {s.batch, s.heads_q, s.seq_q});
  ForwardOptions fo;
  fo.q_offset = s.q_offset;
  fo.k_offset = s.k_offset;
  fo.dynamic_layout = dynamic;
  fo.cu_seqlens = documents;
  // FP8: one factor per tensor, [batch, heads_kv] through zero strides, in the device's memory.
  std::optional<DeviceBytes> descales;
  TensorView descale_views[3];
  if (fp8) {
    const float f[3] = {fp8->q_descale, fp8->k_descale, fp8->v_descale};
    std::vector<uint8_t> fb(sizeof f);
    std::memcpy(fb.data(), f, sizeof f);
    descales.emplace(gpu, fb.size());
    descales->upload(fb);
    for (int n = 0; n < 3; ++n) {
      descale_views[n] = TensorView::contiguous(static_cast<float*>(descales->data()) + n, DType::F32, {s.batch, s.heads_kv});
      descale_views[n].strides = {0, 0};
    }
    fo.q_descale = &descale_views[0], fo.k_descale = &descale_views[1], fo.v_descale = &descale_views[2];
  }
  const std::vector<int64_t> qs{s.batch, s.seq_q, s.heads_q, s.head_dim}, ks{s.batch, s.seq_k, s.heads_kv, s.head_dim},
      vs{s.batch, s.seq_k, s.heads_kv, s.head_dim_v};
  if (backward && backward->forward_given) {
    dout.upload(encode(o, dtype));
    std::vector<uint8_t> lb(lse.size() * sizeof(float));
    std::memcpy(lb.data(), lse.data(), lb.size());
    dlse.upload(lb);
  } else {
    op.forward(view(dq, dtype, qs), view(dk, dtype, ks), view(dv, dtype, vs), view(dout, out_dtype, os), &lse_view, fo);
    if (gpu) synchronize(nullptr);
    dout.download(obytes.data(), obytes.size());
    o = decode(obytes, out_dtype);
    lse.resize(static_cast<size_t>(s.batch * s.heads_q * s.seq_q));
    dlse.download(lse.data(), lse.size() * sizeof(float));
  }
  if (weights) {
    const std::vector<int64_t> ws{s.batch, s.heads_q, s.seq_q, s.seq_k};
    weights->resize(static_cast<size_t>(s.batch * s.heads_q * s.seq_q * s.seq_k));
    DeviceBytes dw(gpu, weights->size() * sizeof(float));
    op.weights(view(dq, dtype, qs), view(dk, dtype, ks), lse_view, view(dw, DType::F32, ws), fo);
    dw.download(weights->data(), weights->size() * sizeof(float));
  }
  if (!backward) return;
  fo.deterministic = backward->deterministic;

  auto zeros = [&](const std::vector<int64_t>& shape) {
    return DeviceBytes(gpu, static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3] * dtype_bytes(dtype)));
  };
  DeviceBytes gq = zeros(qs), gk = zeros(ks), gv = zeros(vs);
  DeviceBytes glse(gpu, std::max<size_t>(backward->lse_grad.size(), 1) * sizeof(float));
  TensorView glse_view;
  if (!backward->lse_grad.empty()) {
    std::vector<uint8_t> gb(backward->lse_grad.size() * sizeof(float));
    std::memcpy(gb.data(), backward->lse_grad.data(), gb.size());
    glse.upload(gb);
    glse_view = view(glse, DType::F32, {s.batch, s.heads_q, s.seq_q});
    fo.dlse = &glse_view;
  }
  op.backward(view(dq, dtype, qs), view(dk, dtype, ks), view(dv, dtype, vs), view(dout, dtype, os), lse_view,
              view(*ddo, dtype, os), view(gq, dtype, qs), view(gk, dtype, ks), view(gv, dtype, vs), fo);
  if (gpu) synchronize(nullptr);
  auto fetch = [&](DeviceBytes& b, const std::vector<int64_t>& shape) {
    std::vector<uint8_t> bytes(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3] * dtype_bytes(dtype)));
    b.download(bytes.data(), bytes.size());
    return decode(bytes, dtype);
  };
  backward->dq = fetch(gq, qs);
  backward->dk = fetch(gk, ks);
  backward->dv = fetch(gv, vs);
}

}  // namespace attnjit::cli
