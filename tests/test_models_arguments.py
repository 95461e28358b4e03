"""gym.models.resolve/check take a str or a Path, and say what to give for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym.errors import ConfigError
from gym.models import check, resolve


@pytest.mark.parametrize("given", [None, 123, "", "   "])
def test_no_name_at_all_is_a_config_error_saying_what_to_give(given):
    """None and 123 ended in "'NoneType' object has no attribute 'startswith'"; "" read as the current
    folder."""
    for call in (check, resolve):
        with pytest.raises(ConfigError, match=r"give a registry name, a local model folder \(str or Path\)"):
            call(given)


def test_a_path_is_taken_as_its_text(gym_home, tmp_path):
    check(Path("gym-tiny"))  # a registry name written as a Path, as a folder name would be
    with pytest.raises(ConfigError, match="no such directory") as e:
        check(tmp_path / "missing-model")
    assert str(tmp_path / "missing-model") in str(e.value)
