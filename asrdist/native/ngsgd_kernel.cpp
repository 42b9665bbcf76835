/* Online natural-gradient preconditioner, compiled. asrdist/optim/ngsgd.py's Python
   `OnlineNaturalGradient` is the specification; the tests hold this file to it.

   Why it exists: a layer's preconditioning is a dozen small tensor operations per minibatch and,
   every fourth one, some sixty more; each costs microseconds of dispatch before any arithmetic,
   which at width 512 was as much time as the arithmetic. Two paths:
   - float32 CPU tensors (training's case): the products go straight to the sgemm/sgemv that torch
     links (MKL's, Fortran interface), and the bias column, the norms for γ, the Gram matrices and
     B are loops; the values agree with Python to float32 rounding.
   - anything else (float64, other devices): the same ATen operations as the Python code, in its
     order; the values are Python's bit for bit.
   On both, the rank×rank float64 algebra is written as loops in the order numpy evaluates it
   (numpy's pairwise sums included) and the eigendecomposition calls LAPACK's dsyevd as
   torch.linalg.eigh does; the re-orthogonalization (rare) stays in Python. Built by
   torch.utils.cpp_extension through asrdist.native. */
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

using at::Tensor;

// MKL's sgemm, which torch links and exports (Fortran interface, column-major)
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);
extern "C" void sgemv_(const char* trans, const int* m, const int* n, const float* alpha, const float* a,
                       const int* lda, const float* x, const int* incx, const float* beta, float* y, const int* incy);
// LAPACK's symmetric eigensolver, the one torch.linalg.eigh calls
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info);

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

/* (c ascending, U column-major: U[i + k n] is entry i of the k-th eigenvector) of a symmetric n × n
   float64 matrix, by LAPACK's dsyevd with its optimal workspace, as torch.linalg.eigh computes it. */
std::pair<std::vector<double>, std::vector<double>> symmetric_eigh(std::vector<double> z, int n) {
    std::vector<double> c(n);
    int lwork = -1, liwork = -1, info = 0, iwork_size = 0;
    double work_size = 0.0;
    dsyevd_("V", "L", &n, z.data(), &n, c.data(), &work_size, &lwork, &iwork_size, &liwork, &info);
    lwork = static_cast<int>(work_size);
    liwork = iwork_size;
    std::vector<double> work(std::max(lwork, 1));
    std::vector<int> iwork(std::max(liwork, 1));
    dsyevd_("V", "L", &n, z.data(), &n, c.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
    TORCH_CHECK(info == 0, "ngsgd kernel: the eigendecomposition of Z failed (LAPACK info ", info, ")");
    return {c, z};
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

// ---- float32 CPU fast path: the products through BLAS directly, the rest as loops -----------------

bool fast_path(const Tensor& x, const Tensor& W) {
    return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && W.is_contiguous() &&
           x.size(0) > 0 && x.size(0) < (1 << 30) && W.size(1) < (1 << 30);
}

/* Σ v² in double, 16 partial sums (two independent vector chains). A float's square is exact in
   double, so fma(d, d, s) rounds exactly as s + d·d: the FMA, where the build has it, changes the
   speed (one instruction instead of two), never the value. */
double sum_squares(const float* v, int64_t n) {
    constexpr int kLanes = 16;
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
            const double d = static_cast<double>(v[i + j]);
#ifdef __FMA__
            acc[j] = std::fma(d, d, acc[j]);
#else
            acc[j] += d * d;
#endif
        }
    for (int width = kLanes / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
    double total = acc[0];
    for (; i < n; ++i) total += static_cast<double>(v[i]) * static_cast<double>(v[i]);
    return total;
}

/* J = Hᵀ X (rank × dim) with the ones column's entries (H's column sums) last when `ones`; H is
   given as Hᵀ (rank × N, row-major). */
Tensor fast_transposed_times(const Tensor& x, const Tensor& Ht, int64_t dim_, bool ones) {
    const int n = static_cast<int>(x.size(0)), cols = static_cast<int>(x.size(1));
    const int rank = static_cast<int>(Ht.size(0)), dim = static_cast<int>(dim_);
    Tensor J = at::empty({rank, dim}, x.options());
    float* j = J.data_ptr<float>();
    const float* ht = Ht.data_ptr<float>();
    const float one = 1.0f, zero = 0.0f;
    // column-major: Jᵀ[:cols] (cols × rank, ld dim) = Xᵀ (cols × n) · H (n × rank, ld n)
    sgemm_("N", "N", &cols, &rank, &n, &one, x.data_ptr<float>(), &cols, ht, &n, &zero, j, &dim);
    if (ones)
        for (int i = 0; i < rank; ++i) {
            double sum = 0.0;
            for (int r = 0; r < n; ++r) sum += ht[static_cast<int64_t>(i) * n + r];
            j[i * dim + dim - 1] = static_cast<float>(sum);
        }
    return J;
}

/* The Gram matrix of a row-major float32 matrix M (rows × cols), through sgemm, as float64 row-major:
   M Mᵀ (rows × rows), or Mᵀ M (cols × cols) with `of_columns`. */
std::vector<double> fast_gram(const float* m, int rows, int cols, bool of_columns) {
    const int size = of_columns ? cols : rows, inner = of_columns ? rows : cols;
    std::vector<float> g(static_cast<size_t>(size) * size);
    const float one = 1.0f, zero = 0.0f;
    // column-major, M is Mᵀ (cols × rows, ld cols): M Mᵀ = (Mᵀ)ᵀ Mᵀ, Mᵀ M = Mᵀ (Mᵀ)ᵀ
    sgemm_(of_columns ? "N" : "T", of_columns ? "T" : "N", &size, &size, &inner, &one, m, &cols, m, &cols, &zero,
           g.data(), &size);
    std::vector<double> out(g.size());
    for (int i = 0; i < size; ++i)
        for (int k = 0; k < size; ++k) out[i * size + k] = g[i + k * size];
    return out;
}

struct Preconditioned {
    Tensor Ht, x_hat, last;  // Hᵀ = (X Wᵀ)ᵀ (rank × N); X̂ = X − H W as columns from x; its ones column or none
    double gamma, tr_x;
};

/* H = X Wᵀ, X̂ = X − H W and the norms for γ, for row-major x (N × cols) and W (rank × dim: its first
   `cols` columns, and the last one, when `ones`, standing for the column of ones): two sgemm calls,
   the second adding −H W into a copy of X (beta = 1: MKL skips its zero fill of X̂, and the norm
   pass only reads), then one pass summing the squares. H is kept transposed (rank × N): MKL
   computes the thin product 20-30% faster at rank 20 with the N rows as its long dimension, and
   H's columns (for the norms, the ones column and J) are then contiguous. (Sweeping row blocks to
   keep X in cache between the two products was slower: MKL loses more on the small products than
   the cache saves.) */
Preconditioned fast_precondition_rows(const Tensor& x, const Tensor& W, const Tensor& two_minus_e, bool ones) {
    const int n = static_cast<int>(x.size(0)), cols = static_cast<int>(x.size(1));
    const int rank = static_cast<int>(W.size(0)), dim = static_cast<int>(W.size(1));
    Preconditioned out;
    out.Ht = at::empty({rank, n}, x.options());
    out.x_hat = at::empty({n, cols}, x.options());
    float* ht = out.Ht.data_ptr<float>();
    float* x_hat = out.x_hat.data_ptr<float>();
    const float* xs = x.data_ptr<float>();
    const float* w = W.data_ptr<float>();
    const float one = 1.0f, minus_one = -1.0f;
    if (ones)
        for (int i = 0; i < rank; ++i) std::fill(ht + static_cast<int64_t>(i) * n, ht + static_cast<int64_t>(i + 1) * n,
                                                 w[i * dim + dim - 1]);
    const float beta = ones ? 1.0f : 0.0f;
    // column-major: H (n × rank, ld n) = X (n × cols) · W[:, :cols]ᵀ (cols × rank) [+ the ones column's weights]
    sgemm_("T", "N", &n, &rank, &cols, &one, xs, &cols, w, &dim, &beta, ht, &n);
    // column-major: X̂ᵀ (cols × n) = Xᵀ − W[:, :cols]ᵀ (cols × rank) · Hᵀ (rank × n), X̂ first a copy of X
    std::memcpy(x_hat, xs, sizeof(float) * static_cast<size_t>(n) * cols);
    sgemm_("N", "T", &cols, &n, &rank, &minus_one, w, &dim, ht, &n, &one, x_hat, &cols);
    double tr_hat = sum_squares(x_hat, static_cast<int64_t>(n) * cols);
    if (ones) {
        out.last = at::empty({n}, x.options());
        float* last = out.last.data_ptr<float>();
        std::vector<float> dot(n, 0.0f);
        for (int i = 0; i < rank; ++i) {
            const float weight = w[i * dim + dim - 1];
            const float* column = ht + static_cast<int64_t>(i) * n;
            for (int r = 0; r < n; ++r) dot[r] += column[r] * weight;
        }
        for (int r = 0; r < n; ++r) last[r] = 1.0f - dot[r];
        tr_hat += sum_squares(last, n);
    }
    const Tensor tme = two_minus_e.contiguous();  // float32, as x (check_inputs)
    const float* t = tme.data_ptr<float>();
    double captured = 0.0;
    for (int i = 0; i < rank; ++i)
        captured += static_cast<double>(t[i]) * sum_squares(ht + static_cast<int64_t>(i) * n, n);
    out.tr_x = tr_hat + captured;
    out.gamma = tr_hat > 0.0 ? std::sqrt(out.tr_x / tr_hat) : 1.0;
    return out;
}

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
    if (fast_path(x, W)) {
        const Preconditioned p = fast_precondition_rows(x, W, two_minus_e, ones);
        return {p.x_hat, p.last, p.gamma};
    }
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

    const bool fast = fast_path(x, W);
    Tensor H, J;  // H: the general path's (the fast one keeps Hᵀ in `projected`)
    std::vector<double> K, L;
    Preconditioned projected;  // the fast path computes X̂ with H (step 5 needs only the current state)
    if (fast) {
        projected = fast_precondition_rows(x, W, two_minus_e, ones);
        J = fast_transposed_times(x, projected.Ht, dim, ones);
        K = fast_gram(J.data_ptr<float>(), static_cast<int>(rank), static_cast<int>(dim), false);
        L = fast_gram(projected.Ht.data_ptr<float>(), static_cast<int>(rank), static_cast<int>(x.size(0)), false);
    } else {
        H = rows.times_transposed(W);
        J = rows.transposed_times(H);
        K = as_vector(at::mm(J, J.t()));
        L = as_vector(at::mm(H.t(), H));
    }
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
    std::vector<double> z(rank * rank);
    for (int64_t i = 0; i < rank; ++i) {
        for (int64_t j = 0; j < rank; ++j) {
            const double scale = inv_sqrt_e[i] * inv_sqrt_e[j];
            const double rsr = (L[i * rank + j] + L[j * rank + i]) * (0.5 * scale);
            double v = (aa * scale) * (K[i * rank + j] + K[j * rank + i]) + (ab * rsr) * (d_rho[i] + d_rho[j]);
            const double diag = i == j ? (b * d_rho[i]) * (b * d_rho[i]) : 0.0;
            z[i * rank + j] = v + diag;
        }
    }
    const auto [c_up, U] = symmetric_eigh(std::move(z), static_cast<int>(rank));
    const double* u = U.data();  // column-major
    std::vector<double> c(c_up.rbegin(), c_up.rend());  // descending; eigenvector k is column rank-1-k
    bool reorthogonalize = !(c[0] <= kConditionThreshold * c[rank - 1]);
    const double c_floor = (rho * b) * (rho * b);
    bool floored = c[rank - 1] < c_floor;
    if (floored) {
        reorthogonalize = true;
        for (double& v : c) v = std::max(v, c_floor);
    }

    auto [x_hat, last, gamma, tr_x] = fast ? std::make_tuple(projected.x_hat, projected.last, projected.gamma, projected.tr_x)
                                           : project(rows, H, W, two_minus_e);
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
    std::vector<double> A(rank * rank);
    const double a_scale = a * scale_sq;
    for (int64_t i = 0; i < rank; ++i) {
        const double row = a_scale * std::sqrt(e_new[i]) / sqrt_c[i];
        for (int64_t j = 0; j < rank; ++j) A[i * rank + j] = row * u[j + (rank - 1 - i) * rank] * inv_sqrt_e[j];
    }
    std::vector<double> coefficient(rank);
    const double ratio = b / (a * scale_sq);
    for (int64_t i = 0; i < rank; ++i) coefficient[i] = ratio * d_rho[i];
    Tensor W_new;
    if (fast) {  // B = J + diag(coefficient) W in place, W' = A B
        float* j = J.data_ptr<float>();
        const float* w = W.data_ptr<float>();
        for (int64_t i = 0; i < rank; ++i) {
            const float coef = static_cast<float>(coefficient[i]);
            for (int64_t k = 0; k < dim; ++k) j[i * dim + k] += w[i * dim + k] * coef;
        }
        std::vector<float> a32(A.begin(), A.end());
        W_new = at::empty({rank, dim}, W.options());
        const int m = static_cast<int>(dim), r = static_cast<int>(rank);
        const float one = 1.0f, zero = 0.0f;
        // column-major: W'ᵀ (dim × rank) = Bᵀ (dim × rank) · Aᵀ (rank × rank)
        sgemm_("N", "N", &m, &r, &r, &one, j, &m, a32.data(), &r, &zero, W_new.data_ptr<float>(), &m);
    } else {
        Tensor B = J.addcmul_(W, as_tensor(coefficient).to(W.options()).unsqueeze(1));
        W_new = at::mm(as_tensor(A).view({rank, rank}).to(W.options()), B);
    }

    std::vector<double> two_minus(rank);
    for (int64_t i = 0; i < rank; ++i) two_minus[i] = 2.0 - e_new[i];
    return {x_hat, last, gamma, W_new, as_tensor(d_new), rho_new, as_tensor(e_new),
            as_tensor(two_minus).to(W.options()), floored, reorthogonalize};
}

/* A natural-gradient layer's (weight, bias) gradient α·X̂_outᵀ X̂_in, X̂_in split at its bias column
   (undefined: no bias): NaturalGradientLinear.preconditioned_gradient's last step, in one call. */
std::tuple<Tensor, Tensor> weight_gradient(const Tensor& x_out_hat, const Tensor& x_in_hat,
                                          const std::optional<Tensor>& bias, double alpha) {
    const Tensor bias_column = bias.has_value() ? *bias : Tensor();
    TORCH_CHECK(x_out_hat.dim() == 2 && x_in_hat.dim() == 2 && x_out_hat.size(0) == x_in_hat.size(0),
                "ngsgd kernel: X̂_out and X̂_in must be matrices with the same rows");
    const bool has_bias = bias_column.defined();
    if (!(fast_path(x_out_hat, x_in_hat) && x_in_hat.scalar_type() == at::kFloat &&
          (!has_bias || (bias_column.scalar_type() == at::kFloat && bias_column.is_contiguous())))) {
        Tensor weight = at::empty({x_out_hat.size(1), x_in_hat.size(1)}, x_in_hat.options());
        at::addmm_out(weight, weight, x_out_hat.t(), x_in_hat, 0.0, alpha);  // as the Python layer does
        return {weight, has_bias ? at::mv(x_out_hat.t(), bias_column).mul_(alpha) : Tensor()};
    }
    const int n = static_cast<int>(x_in_hat.size(0)), d_in = static_cast<int>(x_in_hat.size(1));
    const int d_out = static_cast<int>(x_out_hat.size(1));
    Tensor weight = at::empty({d_out, d_in}, x_in_hat.options());
    const float scale = static_cast<float>(alpha), zero = 0.0f;
    const float* xo = x_out_hat.data_ptr<float>();
    // column-major: weightᵀ (d_in × d_out) = α X̂_inᵀ (d_in × n) · X̂_out (n × d_out)
    sgemm_("N", "T", &d_in, &d_out, &n, &scale, x_in_hat.data_ptr<float>(), &d_in, xo, &d_out, &zero,
           weight.data_ptr<float>(), &d_in);
    Tensor bias_grad;
    if (has_bias) {
        bias_grad = at::empty({d_out}, x_in_hat.options());
        const int inc = 1;
        // column-major: bias (d_out) = α X̂_outᵀ (d_out × n, ld d_out) · X̂_in's ones column (n)
        sgemv_("N", &d_out, &n, &scale, xo, &d_out, bias_column.data_ptr<float>(), &inc, &zero,
               bias_grad.data_ptr<float>(), &inc);
    }
    return {weight, bias_grad};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "asrdist's online natural-gradient preconditioner (asrdist/optim/ngsgd.py), compiled";
    m.def("precondition", &precondition, "X̂ with the current statistics: (x_hat, ones column or None, gamma)");
    m.def("weight_gradient", &weight_gradient, "(weight, bias) gradient alpha X_out_hatᵀ X_in_hat of a layer");
    m.def("update", &update, "X̂ and the statistics update, as OnlineNaturalGradient._update");
}
