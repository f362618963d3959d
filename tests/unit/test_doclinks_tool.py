"""tools/doclinks.py: a link to a heading lands on one, in its own file or another of the docs."""

from __future__ import annotations

import pytest
from scripts import load_script


@pytest.fixture(scope="module")
def doclinks():
    return load_script("tools/doclinks.py", "doclinks_tool")


def test_anchors_are_githubs(doclinks):
    text = ("# Benchmarks\n## LDA at 1 000 topics, tried (issue 49; 2026-12-05)\n## Steps: `--pipeline link`\n"
            "## Steps: `--pipeline link`\n```\n## not a heading\n```\n### α learnt ###\n")
    assert doclinks.anchors(text) == {"benchmarks", "lda-at-1-000-topics-tried-issue-49-2026-12-05",
                                      "steps---pipeline-link", "steps---pipeline-link-1", "α-learnt"}


def test_a_moved_section_breaks_the_links_to_it(doclinks):
    files = {"benchmarks.md": "# B\n## Today\nsee [old](#a-job) and [there](history.md#a-job)\n",
             "history.md": "# H\n## A job\nback to [today](benchmarks.md#today), [gone](benchmarks.md#gone)\n",
             "README.md": "[ok](docs/history.md#a-job) [out of the set](other.md#x) [a file](history.md)\n"}
    assert doclinks.broken(files) == ["benchmarks.md:3: #a-job -> benchmarks.md has no such heading",
                                      "history.md:3: #gone -> benchmarks.md has no such heading"]


def test_the_repositorys_docs_link_to_headings_that_are_there(doclinks):
    assert doclinks.main() == 0
