"""An unknown config key: "did you mean" names only a close match among the keys where the typo
is (a typo of any key finds that key), and a name close to nothing lists the valid keys there
instead of a key that merely shares the prefix (`model.foo` is not `model.d_ff`)."""

from __future__ import annotations

import pytest

from conftest import compose


def _keys_of(node) -> set[str]:
    from omegaconf import OmegaConf

    return set(OmegaConf.to_container(node, resolve=False))


@pytest.mark.parametrize("override, node", [("model.foo=3", "model"), ("+model.foo=3", "model"),
                                            ("+train.zzz=1", "train")])
def test_a_name_close_to_nothing_lists_the_keys_of_its_node(override, node):
    from ablate.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose([override])
    message = str(e.value)
    assert "did you mean" not in message, message
    listed = set(message.split(f"{node} has: ", 1)[1].rstrip(")").split(", "))
    assert listed == _keys_of(compose()[node])


def test_an_unknown_top_level_name_lists_the_top_level_keys():
    from ablate.config.compose import unknown_key_message

    message = unknown_key_message("foo")
    assert "did you mean" not in message
    listed = set(message.split("the top-level keys are: ", 1)[1].rstrip(")").split(", "))
    assert listed == _keys_of(compose()) - {"hydra"}


def test_a_typo_of_every_key_suggests_that_key():
    from ablate.config.compose import schema_keys, unknown_key_message

    for key in (k.lstrip(".") for k in schema_keys()):
        head, _, leaf = key.rpartition(".")
        typo = f"{head}.{leaf}{leaf[-1]}".lstrip(".")  # one letter typed twice
        assert unknown_key_message(typo).endswith(f"(did you mean {key}?)"), typo
    assert unknown_key_message("trian.steps").endswith("(did you mean train.steps?)")
    assert unknown_key_message("model.n_layer").endswith("(did you mean model.n_layers?)")
