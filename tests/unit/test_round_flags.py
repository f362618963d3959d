"""The round apps' model flags (``paramserver mf``, ``lda``) are their config's fields:
each type, default and help is written once, in ``apps/rounds/settings.py``."""

from __future__ import annotations

import dataclasses

import pytest

from paramserver.apps.rounds.settings import LDAConfig, MFConfig
from paramserver.cli import rounds
from paramserver.cli.main import build_parser


def _parse(argv: list[str]):  # type: ignore[no-untyped-def]
    return build_parser(argv[0]).parse_args(argv)


@pytest.mark.parametrize("command,config", [("mf", MFConfig), ("lda", LDAConfig)])
def test_no_flag_means_the_configs_default(command, config):
    assert rounds._config(_parse([command, "--data", "x"]), config) == config()


def test_flags_set_their_fields_with_the_fields_types():
    args = _parse(["lda", "--data", "x", "--topics", "7", "--alpha", "0.5", "--schedule", "none", "--staleness", "2",
                   "--sampler", "hybrid", "--mh-steps", "3", "--mh-share", "0.5", "--optimize-alpha", "4",
                   "--pieces", "2"])
    cfg = rounds._config(args, LDAConfig)
    assert cfg == LDAConfig(topics=7, alpha=0.5, schedule="none", staleness=2, sampler="hybrid", mh_steps=3,
                            mh_share=0.5, optimize_alpha="4", pieces="2")
    assert [type(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)] == [int, int, float, float, int, str, str,
                                                                            int, str, int, float, str]
    for flag, value in [("--schedule", "sometimes"), ("--sampler", "gibbs"), ("--pieces", "3")]:
        with pytest.raises(SystemExit):
            _parse(["lda", "--data", "x", flag, value])


def test_the_help_states_the_configs_defaults(capsys):
    with pytest.raises(SystemExit):
        _parse(["mf", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "factors a user and an item (default 64)" in text and "SGD step (default 0.007)" in text


def test_the_configs_old_homes_still_export_them():
    from paramserver.apps.rounds import lda, lda_sampler, mf

    assert mf.MFConfig is MFConfig and lda.LDAConfig is lda_sampler.LDAConfig is LDAConfig
