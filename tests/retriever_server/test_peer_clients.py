"""Peers' real clients against the real server (issue 83 case 17).

SkyRL's search tool (skyrl-gym 0.4.0 from the package index, a dev dependency) posts one query,
`{"query": str, "topk": 3, "return_scores": true}`, and reads `result` as a list of passage
lists; our server answered 422 ("unknown field 'query'") to every call, so its search
environment got no passages. Skipped only where skyrl-gym is not installed.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_skyrl_gym_search_tool_gets_passages(retriever_server):
    search = pytest.importorskip("skyrl_gym.tools.search")
    url, _ = retriever_server
    # the function, as SkyRL's environments call it: (the answer's JSON, an error or None)
    answer, error = search.call_search_api(f"{url}/retrieve", "Who built the Glimmerfen Lighthouse?", topk=3,
                                           log_requests=False)
    assert error is None, error
    assert len(answer["result"]) == 1 and len(answer["result"][0]) == 3
    assert answer["result"][0][0]["document"]["id"] == "n0" and isinstance(answer["result"][0][0]["score"], float)
    # the tool, as the model's `<search>` reaches it: the passages as text, "Doc i: <contents>"
    tools = search.SearchToolGroup(search_url=f"{url}/retrieve", topk=2, log_requests=False)
    text = json.loads(tools.search("  How long is Vexmoor cheese aged?  "))["result"]
    assert text.startswith('Doc 1: "Vexmoor Cheese"\nVexmoor cheese is aged for nine years'), text
    assert "Doc 2: " in text and "Doc 3: " not in text
    assert tools.execute_tool("search", "Which comet did Teodor Blaine discover?").count("Copperwick") >= 1
