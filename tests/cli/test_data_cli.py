"""`tformer data list|get`: output, caching, and one-line errors with exit status 2."""

import json

from tformer.cli import main


def test_data_list(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "shakespeare" in out and "wikitext2" in out and "tatoeba-en-es" in out


def test_data_get_local_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "t.txt").write_text("hello there\n" * 50)
    assert main(["data", "get", str(tmp_path / "t.txt"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["vocab_size"] == len(set("hello there\n"))
    assert result["splits"]["train"]["tokens"] + result["splits"]["validation"]["tokens"] == 600


def test_data_get_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["data", "get", "wikitext"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean wikitext2" in err
    (tmp_path / "empty.txt").write_text("")
    assert main(["data", "get", str(tmp_path / "empty.txt")]) == 2
    assert "is empty" in capsys.readouterr().err
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    assert main(["data", "get", str(tmp_path / "blob.bin")]) == 2
    assert "looks binary" in capsys.readouterr().err
