/* Online natural-gradient preconditioner, compiled (see asrdist/optim/ngsgd.py, whose Python
   `OnlineNaturalGradient` is the specification: this file computes the same values bit for bit,
   step for step, and the tests hold it to that).

   Why it exists: a layer's preconditioning is a dozen small tensor operations and, every fourth
   minibatch, some sixty rank x rank ones; from Python each costs an interpreter round trip, which
   at width 512 is as much time as the arithmetic. Here the same ATen operations run in one call.
   The small float64 algebra is written as loops in the order numpy evaluates it (numpy's pairwise
   sums included), the eigendecomposition is torch's `linalg_eigh`, and the re-orthogonalization
   (rare) stays in Python. Built by torch.utils.cpp_extension through asrdist.native. */
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

using at::Tensor;

namespace {

constexpr double kEpsilon = 1.0e-10;  // ngsgd.EPSILON
constexpr double kDelta = 5.0e-4;     // ngsgd.DELTA
constexpr double kConditionThreshold = 1.0e6;

/* numpy's float64 add.reduce of a contiguous vector (pairwise, blocks of 8 up to 128). */
double numpy_sum(const double* a, int64_t n) {
    if (n < 8) {
        double res = -0.0;
        for (int64_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j];
        int64_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return numpy_sum(a, n2) + numpy_sum(a + n2, n - n2);
}

double numpy_sum(const std::vector<double>& a) { return numpy_sum(a.data(), static_cast<int64_t>(a.size())); }

std::vector<double> as_vector(const Tensor& t) {
    Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

Tensor as_tensor(const std::vector<double>& v) {
    return at::tensor(at::ArrayRef<double>(v), at::TensorOptions().dtype(at::kDouble));
}

/* Diagonal of E for (d, rho): ngsgd.OnlineNaturalGradient._e. */
std::vector<double> e_diag(const std::vector<double>& d, double rho, double alpha, int64_t dim) {
    const double beta = rho * (1.0 + alpha) + alpha * numpy_sum(d) / static_cast<double>(dim);
    std::vector<double> e(d.size());
    for (size_t i = 0; i < d.size(); ++i) e[i] = 1.0 / (beta / d[i] + 1.0);
    return e;
}

/* The minibatch X: rows of x, with a column of ones appended when `ones` (never materialized). */
struct Rows {
    const Tensor& x;
    bool ones;

    Tensor times_transposed(const Tensor& W) const {  // H = X Wᵀ
        if (ones) {
            const int64_t last = W.size(1) - 1;
            return at::addmm(W.select(1, last), x, W.narrow(1, 0, last).t());
        }
        return at::mm(x, W.t());
    }

    std::tuple<Tensor, Tensor> residual(const Tensor& H, const Tensor& W) const {  // X − H W
        if (ones) {
            const int64_t last = W.size(1) - 1;
            return {at::addmm(x, H, W.narrow(1, 0, last), 1.0, -1.0), at::mv(H, W.select(1, last)).neg_().add_(1.0)};
        }
        return {at::addmm(x, H, W, 1.0, -1.0), Tensor()};
    }

    Tensor transposed_times(const Tensor& H) const {  // J = Hᵀ X
        Tensor J = at::mm(H.t(), x);
        return ones ? at::cat({J, H.sum(0).unsqueeze(1)}, 1) : J;
    }
};

/* (X̂ columns from x, its ones column or undefined, γ, tr(XXᵀ)): OnlineNaturalGradient._project. */
std::tuple<Tensor, Tensor, double, double> project(const Rows& rows, const Tensor& H, const Tensor& W,
                                                   const Tensor& two_minus_e) {
    auto [x_hat, last] = rows.residual(H, W);
    Tensor flat = x_hat.reshape(-1);
    std::vector<Tensor> terms{at::dot(flat, flat), at::dot(H.square().sum(0), two_minus_e)};
    if (last.defined()) terms.push_back(at::dot(last, last));
    const std::vector<double> values = as_vector(at::stack(terms));
    const double tr_hat = values[0] + (last.defined() ? values[2] : 0.0);
    const double tr_x = tr_hat + values[1];
    return {x_hat, last, tr_hat > 0.0 ? std::sqrt(tr_x / tr_hat) : 1.0, tr_x};
}

void check_inputs(const Tensor& x, const Tensor& W, const Tensor& two_minus_e) {
    TORCH_CHECK(x.dim() == 2 && W.dim() == 2 && two_minus_e.dim() == 1, "ngsgd kernel: x and W must be matrices");
    TORCH_CHECK(W.scalar_type() == x.scalar_type() && two_minus_e.scalar_type() == x.scalar_type(),
                "ngsgd kernel: x, W and 2 - e must share a dtype");
    TORCH_CHECK(two_minus_e.size(0) == W.size(0), "ngsgd kernel: 2 - e must have one entry per row of W");
}

}  // namespace

/* The preconditioned rows without a statistics update: (X̂, ones column or None, γ). */
std::tuple<Tensor, Tensor, double> precondition(const Tensor& x, const Tensor& W, const Tensor& two_minus_e,
                                                bool ones) {
    check_inputs(x, W, two_minus_e);
    const Rows rows{x, ones};
    auto [x_hat, last, gamma, tr_x] = project(rows, rows.times_transposed(W), W, two_minus_e);
    (void)tr_x;
    return {x_hat, last, gamma};
}

/* Precondition the rows with the current F, then move F towards the scatter of scale·rows:
   OnlineNaturalGradient._update, steps 1–5, with a = η/N, b = 1 − η, scale_sq = scale².
   Returns (X̂, ones column or None, γ, W' before any re-orthogonalization, d', ρ', e', 2 − e' in
   W's dtype, floored, re-orthogonalize). d, e: float64 CPU vectors of the current state. */
std::tuple<Tensor, Tensor, double, Tensor, Tensor, double, Tensor, Tensor, bool, bool> update(
        const Tensor& x, const Tensor& W, const Tensor& two_minus_e, bool ones, const Tensor& d_in, double rho,
        const Tensor& e_in, double alpha, double a, double b, double scale_sq) {
    check_inputs(x, W, two_minus_e);
    const Rows rows{x, ones};
    const int64_t rank = W.size(0), dim = W.size(1);
    const std::vector<double> d = as_vector(d_in), e = as_vector(e_in);
    TORCH_CHECK(static_cast<int64_t>(d.size()) == rank && static_cast<int64_t>(e.size()) == rank,
                "ngsgd kernel: d and e must have one entry per row of W");

    const Tensor H = rows.times_transposed(W);
    Tensor J = rows.transposed_times(H);
    std::vector<double> K = as_vector(at::mm(J, J.t())), L = as_vector(at::mm(H.t(), H));
    const double k_scale = scale_sq * scale_sq;
    for (double& v : K) v *= k_scale;
    for (double& v : L) v *= scale_sq;

    std::vector<double> inv_sqrt_e(rank), d_rho(rank);
    for (int64_t i = 0; i < rank; ++i) {
        inv_sqrt_e[i] = 1.0 / std::sqrt(e[i]);
        d_rho[i] = d[i] + rho;
    }
    // Z = Y Yᵀ with Y = a E^{-½} J + b (D + ρ) R, from rank×rank quantities only
    const double aa = a * a * 0.5, ab = a * b;
    Tensor Z = at::empty({rank, rank}, at::TensorOptions().dtype(at::kDouble));
    double* z = Z.data_ptr<double>();
    for (int64_t i = 0; i < rank; ++i) {
        for (int64_t j = 0; j < rank; ++j) {
            const double scale = inv_sqrt_e[i] * inv_sqrt_e[j];
            const double rsr = (L[i * rank + j] + L[j * rank + i]) * (0.5 * scale);
            double v = (aa * scale) * (K[i * rank + j] + K[j * rank + i]) + (ab * rsr) * (d_rho[i] + d_rho[j]);
            const double diag = i == j ? (b * d_rho[i]) * (b * d_rho[i]) : 0.0;
            z[i * rank + j] = v + diag;
        }
    }
    auto [c_asc, U_asc] = at::linalg_eigh(Z);
    const std::vector<double> c_up = as_vector(c_asc);
    const Tensor U = U_asc.contiguous();
    const double* u = U.data_ptr<double>();
    std::vector<double> c(c_up.rbegin(), c_up.rend());  // descending; column k of U is column rank-1-k
    bool reorthogonalize = !(c[0] <= kConditionThreshold * c[rank - 1]);
    const double c_floor = (rho * b) * (rho * b);
    bool floored = c[rank - 1] < c_floor;
    if (floored) {
        reorthogonalize = true;
        for (double& v : c) v = std::max(v, c_floor);
    }

    auto [x_hat, last, gamma, tr_x] = project(rows, H, W, two_minus_e);
    tr_x *= scale_sq;

    std::vector<double> sqrt_c(rank);
    for (int64_t i = 0; i < rank; ++i) sqrt_c[i] = std::sqrt(c[i]);
    double rho_new = (a * tr_x + b * (static_cast<double>(dim) * rho + numpy_sum(d)) - numpy_sum(sqrt_c)) /
                     static_cast<double>(dim - rank);
    std::vector<double> d_new(rank);
    for (int64_t i = 0; i < rank; ++i) d_new[i] = sqrt_c[i] - rho_new;
    const double floor = std::max(kEpsilon, kDelta * sqrt_c[0]);
    if (!(rho_new >= floor)) {
        rho_new = floor;
        floored = true;
    }
    if (d_new[rank - 1] < floor) {
        for (double& v : d_new) v = std::max(v, floor);
        floored = true;
    }
    const std::vector<double> e_new = e_diag(d_new, rho_new, alpha, dim);

    // W' = E'^{½} R' = A B, A = a E'^{½} C^{-½} Uᵀ E^{-½}, B = scale_sq·J + (b/a)(D + ρ) W (J lacks scale_sq)
    Tensor A = at::empty({rank, rank}, at::TensorOptions().dtype(at::kDouble));
    double* pa = A.data_ptr<double>();
    const double a_scale = a * scale_sq;
    for (int64_t i = 0; i < rank; ++i) {
        const double row = a_scale * std::sqrt(e_new[i]) / sqrt_c[i];
        for (int64_t j = 0; j < rank; ++j) pa[i * rank + j] = row * u[j * rank + (rank - 1 - i)] * inv_sqrt_e[j];
    }
    std::vector<double> coefficient(rank);
    const double ratio = b / (a * scale_sq);
    for (int64_t i = 0; i < rank; ++i) coefficient[i] = ratio * d_rho[i];
    Tensor B = J.addcmul_(W, as_tensor(coefficient).to(W.options()).unsqueeze(1));
    Tensor W_new = at::mm(A.to(W.options()), B);

    std::vector<double> two_minus(rank);
    for (int64_t i = 0; i < rank; ++i) two_minus[i] = 2.0 - e_new[i];
    return {x_hat, last, gamma, W_new, as_tensor(d_new), rho_new, as_tensor(e_new),
            as_tensor(two_minus).to(W.options()), floored, reorthogonalize};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "asrdist's online natural-gradient preconditioner (asrdist/optim/ngsgd.py), compiled";
    m.def("precondition", &precondition, "X̂ with the current statistics: (x_hat, ones column or None, gamma)");
    m.def("update", &update, "X̂ and the statistics update, as OnlineNaturalGradient._update");
}
