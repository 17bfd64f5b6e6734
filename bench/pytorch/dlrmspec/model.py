"""The DLRM a model spec describes (docs/model-spec.md), with the init of dlrm_reference.py.

  bottom  : 13 -> bottom_mlp, ReLU after every layer (output width d)
  sparse  : per weight group one nn.EmbeddingBag (sparse gradients), looked up with F.embedding_bag per pooling mode
  dot     : [z, T_i . T_j for i > j] (all dims equal d), width d + n (n - 1) / 2, n = features + 1
  dcn     : x0 = [z, e_1, ..., e_F] (width D = d + sum(dim)); x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l
            (TorchRec's LowRankCrossNet), V_l [rank x D] without bias, U_l [D x rank] with bias; the top reads x_L
  top     : width -> top_mlp, ReLU except the last; the logit
  init    : linear weights normal(0, sqrt(2 / (in + out))), biases normal(0, sqrt(1 / out)), the cross layers'
            V and U included; embedding rows uniform(-init_scale, init_scale); drawn from one generator in the order
            bottom, top, cross layers (V_l, U_l, b_l per layer), embedding groups - so a `dot` spec with one group
            draws exactly what the run without a spec draws
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .spec import NUM_DENSE


def mlp(sizes, last_relu, gen):
    """dlrm_reference.py's MLP (same layers, same draws from `gen`)."""
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (sizes[i] + sizes[i + 1])), generator=gen)
            lin.bias.normal_(0.0, math.sqrt(1.0 / sizes[i + 1]), generator=gen)
        layers.append(lin)
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class LowRankCrossNet(nn.Module):
    """DCNv2's low-rank cross layers: x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l."""

    def __init__(self, width, layers, rank, gen):
        super().__init__()
        self.v = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))
        self.u = nn.ModuleList(nn.Linear(rank, width) for _ in range(layers))
        std = math.sqrt(2.0 / (width + rank))
        with torch.no_grad():
            for v, u in zip(self.v, self.u):
                v.weight.normal_(0.0, std, generator=gen)
                u.weight.normal_(0.0, std, generator=gen)
                u.bias.normal_(0.0, math.sqrt(1.0 / width), generator=gen)

    def forward(self, x0):
        x = x0
        for v, u in zip(self.v, self.u):
            x = x0 * u(v(x)) + x
        return x


class SpecDlrm(nn.Module):
    def __init__(self, layout, group_rows, gen, init_scale):
        super().__init__()
        spec = layout.spec
        self.kind = spec.interaction
        self.calls = [(c.group, c.mode, len(c.features), layout.groups[c.group].dim) for c in layout.calls]
        self.bottom = mlp([NUM_DENSE] + spec.bottom_mlp, True, gen)
        self.top = mlp([spec.interaction_width] + spec.top_mlp, False, gen)
        d = spec.bottom_mlp[-1]
        order = [f for c in layout.calls for f in c.features]  # features in the order the calls produce them
        if self.kind == "dcn":
            self.cross = LowRankCrossNet(spec.interaction_width, spec.dcn_layers, spec.dcn_rank, gen)
            # columns of [z, call outputs...] -> [z, e_1, ..., e_F] (spec order)
            start, pos = d, {}
            for f in order:
                pos[f] = start
                start += spec.features[f].dim
            cols = list(range(d))
            for f in spec.features:
                cols += range(pos[f.index], pos[f.index] + f.dim)
            perm = cols
        else:
            self.cross = None
            perm = [order.index(f.index) for f in spec.features]
            n = len(spec.features) + 1
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("li", li)
            self.register_buffer("lj", lj)
        self.permute = perm != sorted(perm)
        self.register_buffer("perm", torch.as_tensor(perm, dtype=torch.int64))
        self.emb = nn.ModuleList(
            nn.EmbeddingBag(rows, g.dim, mode="sum", sparse=True) for g, rows in zip(layout.groups, group_rows)
        )
        with torch.no_grad():
            for e in self.emb:
                e.weight.uniform_(-init_scale, init_scale, generator=gen)

    def pooled(self, bags):
        """Per call, its pooled embeddings [b, features, dim]."""
        out = []
        for (g, mode, w, dim), (idx, offsets) in zip(self.calls, bags):
            p = F.embedding_bag(idx, self.emb[g].weight, offsets, mode=mode, sparse=True)
            out.append(p.view(-1, w, dim))
        return out

    def forward(self, dense, bags):
        x = self.bottom(dense)  # [b, d]
        pooled = self.pooled(bags)
        if self.cross is not None:
            b = x.shape[0]
            x0 = torch.cat([x] + [p.reshape(b, -1) for p in pooled], dim=1)  # f32 (cat promotes a bf16 z)
            if self.permute:
                x0 = x0.index_select(1, self.perm)
            return self.top(self.cross(x0)).squeeze(1)
        e = pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)  # [b, F, d]
        if self.permute:
            e = e.index_select(1, self.perm)
        t = torch.cat([x.unsqueeze(1), e], dim=1)  # [b, F + 1, d]
        z = torch.bmm(t, t.transpose(1, 2))
        pairs = z[:, self.li, self.lj]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)
