"""Everything a method's module imports, in one place: ``from fedseg.algorithms.toolkit import ...``.

A method (built in, registered from user code or installed as a package, docs/api.md "Writing a method") subclasses
the FedAvg pair and says only what differs from FedAvg. What it subclasses, declares and returns:

- ``FedAvgServer``, ``FedAvgClient``, ``FedAvgOptions`` (:mod:`fedseg.algorithms.fedavg`: its module docstring lists
  every hook a method overrides and every class-level switch it sets), ``MethodOptions`` (an options model without
  FedAvg's options), ``AlgorithmSpec`` (the ``SPECS`` entry), ``TrainHooks`` (how local training differs),
  ``TrainStats`` (what local training did: ``after_fit``'s argument), ``ClientContext`` (what a site sees while it
  answers one message), ``Task`` (the model every participant knows), ``Message`` (tensors by name plus metadata),
  ``MethodError`` (a method's own failure, in one line).

The helpers the built-in methods share (shapes: a "model" is ``{entry name: tensor}`` as ``weights_of`` returns):

- ``weighted_average(updates, weights)``: ``sum_k p_k updates[k]`` per name, ``p_k = weights[k] / sum(weights)``,
  accumulated in float64 and cast back to each tensor's dtype;
- ``state_group(ctx.state, prefix)`` / ``put_group(ctx.state, prefix, tensors)``: read / replace the ``prefix/<name>``
  entries of a site's client state store (what a site keeps across rounds);
- ``MODEL``: the prefix of the model's tensors in a message (``msg.group(MODEL)``) and in a reply;
- ``prefixed(prefix, tensors)``: ``{name: t}`` -> ``{prefix/name: t}`` (a message's or a ``state_dict``'s group;
  ``Message(d).group(prefix)`` reads it back);
- ``weights_of(model)``: a detached CPU copy of every floating-point entry of ``model.state_dict()``;
- ``options_as(ctx.options, MyOptions)``: a client's options typed as the method's own model (a TypeError otherwise);
- ``proximal_term(model, anchor, mu)``: ``(mu / 2) sum_p ||p - anchor[p]||^2`` over the trainable parameters, a
  scalar tensor; ``ProximalTerm.towards(weights, model, mu)``: the ``TrainHooks`` adding it to every step's loss.

Import these from here (typed: ``from fedseg import FedAvgServer`` is resolved lazily, so a type checker sees
``Any`` there and cannot tell a subclass's attribute types). Their modules stay where they are; this module only
gathers them, and nothing in fedseg imports it.
"""

from __future__ import annotations

from fedseg.algorithms.aggregate import weighted_average
from fedseg.algorithms.client_state import put_group, state_group
from fedseg.algorithms.fedavg import FedAvgClient, FedAvgOptions, FedAvgServer
from fedseg.algorithms.prefixes import MODEL
from fedseg.algorithms.proximal import ProximalTerm, proximal_term
from fedseg.algorithms.registry import AlgorithmSpec
from fedseg.engine.context import ClientContext, MethodOptions, Task, options_as
from fedseg.engine.faults import MethodError
from fedseg.engine.messages import Message, prefixed, weights_of
from fedseg.train import TrainHooks, TrainStats

__all__ = [
    "MODEL",
    "AlgorithmSpec",
    "ClientContext",
    "FedAvgClient",
    "FedAvgOptions",
    "FedAvgServer",
    "Message",
    "MethodError",
    "MethodOptions",
    "ProximalTerm",
    "Task",
    "TrainHooks",
    "TrainStats",
    "options_as",
    "prefixed",
    "proximal_term",
    "put_group",
    "state_group",
    "weighted_average",
    "weights_of",
]
