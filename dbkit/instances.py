"""A model instance from a row already read, without `Model.__init__`.

`Model.from_db` builds each instance through `Model.__init__`, which sets every field through
its descriptor, one `setattr` at a time, and sends `pre_init` and `post_init`. For a row that
holds every concrete field, in the model's order, the result is the same instance as filling
its `__dict__` at once: a field's descriptor keeps the value under the field's `attname` in
`__dict__` (a foreign key's `__set__` also clears a cached related object, which a new instance
does not have). On the platform's hot path (the job's row every move returns, and its event's)
that saved about 2 % of a no-op job's instructions (bench/README.md, "A job's moves").

When a receiver listens to `pre_init` or `post_init` for the model, `from_db` is used as before:
such a receiver expects to run.
"""

from __future__ import annotations

from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init


def instance_from_row(model: type[Model], using: str, attnames: list[str], values: list) -> Model:
    """What `model.from_db(using, attnames, values)` returns, where `attnames` are all the
    model's concrete fields' attribute names, in `_meta.concrete_fields` order."""
    # No receiver at all (the usual case) is what `Signal.send` itself checks first.
    if (len(values) != len(model._meta.concrete_fields)
            or ((pre_init.receivers or post_init.receivers)
                and (pre_init.has_listeners(model) or post_init.has_listeners(model)))):
        return model.from_db(using, attnames, values)
    instance = model.__new__(model)
    instance.__dict__.update(zip(attnames, values, strict=True))
    state = instance._state = ModelState()
    state.adding = False
    state.db = using
    return instance
