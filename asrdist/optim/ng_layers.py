"""Natural-gradient affine layers (Kaldi's NaturalGradientAffineComponent) for any PyTorch model.

`NaturalGradientLinear` is an `nn.Linear` whose backward replaces the weight and bias gradient by
s_in·s_out·X̂_outᵀ X̂_in, its inputs (with the bias column) and output derivatives preconditioned by
an `OnlineNaturalGradient` each; the gradient lands in `p.grad`, so every strategy sees it as any
other. `apply_natural_gradient(model)` swaps every `nn.Linear` in place (`convert_lstm=True`: LSTMs
too, as `AffineLSTM`); `natural_gradient_state` / `load_natural_gradient_state` save the
preconditioners for exact resume. Details: docs/optimizers.md#natural-gradient-layers-optimng_layerspy."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from asrdist.optim.ngsgd import OnlineNaturalGradient, native_kernel


def default_ranks(in_features: int, out_features: int, bias: bool = True,
                  max_rank_in: int = 20, max_rank_out: int = 80) -> tuple[int, int]:
    """Kaldi's defaults, clamped below the preconditioned dimension."""
    dim_in = in_features + int(bias)
    rank_in = max(0, min(max_rank_in, (in_features + 1) // 2, dim_in - 1))
    rank_out = max(0, min(max_rank_out, (out_features + 1) // 2, out_features - 1))
    return rank_in, rank_out


class _NaturalGradientAffine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        # X̂_in depends on the forward activations only: precondition them now, while x is hot in
        # cache, and keep X̂_in (not x) for backward.
        # under bf16 autocast (`train.precision: bf16`) the product runs in bf16 and the
        # preconditioner, its statistics and the weight's gradient in fp32
        update = layer.training
        x_in_hat, bias_column, ctx.s_in = layer.precondition_inputs(x.float(), update)
        ctx.save_for_backward(x_in_hat, bias_column, weight)
        ctx.layer, ctx.update = layer, update
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x_in_hat, bias_column, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        # Precondition the output derivatives first, while they are still in cache from the layer
        # above; the input gradient's product streams the whole weight matrix through it.
        if needs_weight or needs_bias:
            grad_weight, grad_bias = ctx.layer.preconditioned_gradient(x_in_hat, bias_column, ctx.s_in,
                                                                       grad_out.float(), ctx.update)
            if not needs_weight:
                grad_weight = None
        if needs_x:
            grad_x = grad_out @ (weight if weight.dtype == grad_out.dtype else weight.to(grad_out.dtype))
        return grad_x, grad_weight, grad_bias, None


class NaturalGradientLinear(nn.Linear):
    """Drop-in `nn.Linear` trained with online natural gradient (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, rank_in: int | None = None,
                 rank_out: int | None = None, num_samples_history: float = 2000.0, alpha: float = 4.0,
                 update_period: int = 4, seed: int = 0, kernel: str = "auto", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._make_preconditioners(rank_in, rank_out, num_samples_history, alpha, update_period, seed, kernel)

    def _make_preconditioners(self, rank_in, rank_out, num_samples_history, alpha, update_period, seed,
                              kernel) -> None:
        default_in, default_out = default_ranks(self.in_features, self.out_features, self.bias is not None)
        options = dict(num_samples_history=num_samples_history, alpha=alpha, update_period=update_period,
                       kernel=kernel)
        self.preconditioner_in = OnlineNaturalGradient(
            self.in_features + int(self.bias is not None), default_in if rank_in is None else rank_in,
            seed=seed, **options)
        self.preconditioner_out = OnlineNaturalGradient(
            self.out_features, default_out if rank_out is None else rank_out, seed=seed + 1, **options)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **options: Any) -> "NaturalGradientLinear":
        """A natural-gradient layer sharing `linear`'s Parameter objects."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight = linear.weight
        layer.register_parameter("bias", linear.bias)
        layer.training = linear.training
        layer._make_preconditioners(options.pop("rank_in", None), options.pop("rank_out", None),
                                    options.pop("num_samples_history", 2000.0), options.pop("alpha", 4.0),
                                    options.pop("update_period", 4), options.pop("seed", 0),
                                    options.pop("kernel", "auto"))
        if options:
            raise TypeError(f"NaturalGradientLinear: unknown options {sorted(options)}")
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if torch.is_grad_enabled() and (weight.requires_grad or (bias is not None and bias.requires_grad)):
            return _NaturalGradientAffine.apply(x, weight, bias, self)
        return F.linear(x, weight, bias)

    def precondition_inputs(self, x: torch.Tensor, update: bool = True
                            ) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """(X̂_in's first D_in columns, its bias column or None, s_in): X_in is x as rows (N, D_in)
        with a column of ones appended when the layer has a bias (never materialized)."""
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.bias is None:
            x_hat, s_in = self.preconditioner_in.precondition_unscaled(rows, update)
            return x_hat, None, s_in
        return self.preconditioner_in.precondition_with_ones(rows, update)

    def preconditioned_gradient(self, x_in_hat: torch.Tensor, bias_column: torch.Tensor | None, s_in: float,
                                grad_out: torch.Tensor, update: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight grad, bias grad) = s_in·s_out·X̂_outᵀ X̂_in, X̂_in split at its bias column, given
        (X̂_in, its bias column, s_in) from `precondition_inputs(x)`."""
        # Kaldi's derivatives are those of the objective summed over the minibatch; a mean-reduced
        # loss divides them by the row count, which would push tiny derivatives under the
        # preconditioner's absolute floor (1e-10). Precondition the summed-objective derivatives.
        rows = x_in_hat.shape[0]
        preconditioner = self.preconditioner_out
        x_out_hat, s_out = preconditioner.precondition_unscaled(
            grad_out if grad_out.dim() == 2 else grad_out.reshape(-1, self.out_features), update, scale=float(rows))
        alpha = s_in * s_out / rows
        if preconditioner.native:
            return native_kernel().weight_gradient(x_out_hat, x_in_hat, bias_column, alpha)
        weight = x_in_hat.new_empty(self.out_features, self.in_features)
        torch.addmm(weight, x_out_hat.T, x_in_hat, beta=0.0, alpha=alpha, out=weight)
        if bias_column is None:
            return weight, None
        return weight, torch.mv(x_out_hat.T, bias_column).mul_(alpha)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rank_in={self.preconditioner_in.rank}, "
                f"rank_out={self.preconditioner_out.rank}")


class AffineLSTM(nn.Module):
    """Batch-first (bi)LSTM whose four gates come from two `nn.Linear` maps per layer and direction
    (`input_maps`: x -> 4H over the whole sequence at once; `recurrent_maps`: h -> 4H, bias-free,
    once per time step, each call one minibatch for its preconditioners, like Kaldi's per-step
    recurrent affine components), so natural gradient reaches every affine map. Gate order and
    the single bias (b_ih + b_hh) follow `nn.LSTM`; `from_lstm` copies its weights. Much slower
    than the fused kernel: a Python loop over time."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bidirectional, self.dropout = bidirectional, dropout
        directions = 2 if bidirectional else 1
        self.input_maps, self.recurrent_maps = nn.ModuleList(), nn.ModuleList()
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            for _ in range(directions):
                self.input_maps.append(nn.Linear(width, 4 * hidden_size, bias=bias))
                self.recurrent_maps.append(nn.Linear(hidden_size, 4 * hidden_size, bias=False))

    @classmethod
    def from_lstm(cls, lstm: nn.LSTM) -> "AffineLSTM":
        if not lstm.batch_first or lstm.proj_size:
            raise ValueError("AffineLSTM.from_lstm: only batch_first LSTMs without projection are supported")
        new = cls(lstm.input_size, lstm.hidden_size, lstm.num_layers, lstm.bidirectional, lstm.dropout, lstm.bias)
        new.train(lstm.training)
        directions = 2 if lstm.bidirectional else 1
        with torch.no_grad():
            for layer in range(lstm.num_layers):
                for direction in range(directions):
                    suffix = f"_l{layer}" + ("_reverse" if direction else "")
                    i = layer * directions + direction
                    new.input_maps[i].weight.copy_(getattr(lstm, "weight_ih" + suffix))
                    new.recurrent_maps[i].weight.copy_(getattr(lstm, "weight_hh" + suffix))
                    if lstm.bias:
                        new.input_maps[i].bias.copy_(getattr(lstm, "bias_ih" + suffix) + getattr(lstm, "bias_hh" + suffix))
        return new

    def _run_direction(self, gates_x: torch.Tensor, recurrent: nn.Module, reverse: bool) -> torch.Tensor:
        batch, steps, _ = gates_x.shape
        h = gates_x.new_zeros(batch, self.hidden_size)
        c = gates_x.new_zeros(batch, self.hidden_size)
        outputs: list[torch.Tensor] = [None] * steps  # type: ignore[list-item]
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            i, f, g, o = (gates_x[:, t] + recurrent(h)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs[t] = h
        return torch.stack(outputs, dim=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """x [B, T, input_size] -> ([B, T, H·directions], None); the None stands for nn.LSTM's (h, c)."""
        directions = 2 if self.bidirectional else 1
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0:
                x = F.dropout(x, self.dropout, self.training)
            outs = [self._run_direction(self.input_maps[layer * directions + k](x),
                                        self.recurrent_maps[layer * directions + k], reverse=k == 1)
                    for k in range(directions)]
            x = outs[0] if directions == 1 else torch.cat(outs, dim=2)
        return x, None


def _replace_children(module: nn.Module, options: dict[str, Any], convert_lstm: bool) -> None:
    for name, child in module.named_children():
        if convert_lstm and isinstance(child, nn.LSTM):
            child = AffineLSTM.from_lstm(child)
            setattr(module, name, child)
        if isinstance(child, nn.Linear) and not isinstance(child, NaturalGradientLinear):
            setattr(module, name, NaturalGradientLinear.from_linear(child, **options))
        else:
            _replace_children(child, options, convert_lstm)


def apply_natural_gradient(model: nn.Module, *, convert_lstm: bool = False, **options: Any) -> nn.Module:
    """Swap every `nn.Linear` in `model` (in place) for a `NaturalGradientLinear` sharing its
    parameters; `options` go to every layer (rank_in, rank_out, num_samples_history, alpha,
    update_period, seed, kernel). With `convert_lstm`, `nn.LSTM`s become `AffineLSTM`s first (new
    Parameter objects: build the optimizer after this call). Returns `model`."""
    if isinstance(model, nn.Linear):
        raise ValueError("apply_natural_gradient: wrap the nn.Linear in a module (it is replaced in its parent)")
    _replace_children(model, dict(options), convert_lstm)
    return model


def natural_gradient_layers(model: nn.Module) -> dict[str, NaturalGradientLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, NaturalGradientLinear)}


def natural_gradient_state(model: nn.Module) -> dict[str, Any]:
    """Preconditioner statistics of every natural-gradient layer, by module name."""
    return {name: {"in": m.preconditioner_in.state_dict(), "out": m.preconditioner_out.state_dict()}
            for name, m in natural_gradient_layers(model).items()}


def load_natural_gradient_state(model: nn.Module, state: dict[str, Any]) -> None:
    layers = natural_gradient_layers(model)
    if set(layers) != set(state):
        raise ValueError(f"natural-gradient state names {sorted(state)} do not match the model's {sorted(layers)}")
    for name, layer in layers.items():
        layer.preconditioner_in.load_state_dict(state[name]["in"])
        layer.preconditioner_out.load_state_dict(state[name]["out"])
