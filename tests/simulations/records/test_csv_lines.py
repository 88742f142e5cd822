"""The one line-by-line reader of fedlmc's CSV files: each physical line is judged on its own
(a damaged line never swallows its neighbour), the header is found past a byte order mark and
junk, and a bad line is set aside byte for byte, bytes that are not UTF-8 included."""

from __future__ import annotations

from fedlmc.simulations.records.csv_lines import rejected_path, set_aside, split_lines

HEADER = "cell_id,status,value"


def check(values):
    return None if values["status"] in ("ok", "failed") else f"status {values['status']!r}"


def test_every_bad_line_is_named_with_its_reason_and_the_good_ones_kept(tmp_path):
    path = tmp_path / "results.csv"
    lines = [
        b"\xef\xbb\xbfjunk above the header",  # a BOM, then junk
        HEADER.encode(),
        b"0123456789ab,ok,1",
        b'x,"open quote',
        b"0123456789ab,ok,2,extra",
        b"0123456789ab,ok,\xff",  # not UTF-8
        b"0123456789ab,ok,3\x1b[31m",
        b"0123456789ab,maybe,4",
        b"",
        b"0123456789ab,failed,5",
        b"0123456789ab,ok,6",  # the last line, cut off: no line end follows
    ]
    path.write_bytes(b"\n".join(lines))
    read = split_lines(path, ("cell_id", "status"), check)
    assert read.header == HEADER.split(",")
    assert read.good == [["0123456789ab", "ok", "1"], ["0123456789ab", "failed", "5"]]
    assert [reason for _, reason in read.bad] == [
        "line 1: before the header",
        "line 4: an unclosed quote",
        "line 5: 4 fields where the header has 3",
        "line 6: not UTF-8 text",
        "line 7: value holds a control character ('\\x1b'); allowed: plain text",
        "line 8: status 'maybe'",
        "line 11: cut off (the file does not end with a line end)",
    ]
    target = set_aside(path, read.header, [line for line, _ in read.bad])
    assert target == rejected_path(path) == tmp_path / "results.rejected.csv"
    kept = target.read_bytes().split(b"\n")
    assert kept[0] == HEADER.encode() and kept[1] == b"junk above the header"
    assert kept[4] == b"0123456789ab,ok,\xff"  # byte for byte
    set_aside(path, read.header, ["again"])  # appended, the header once
    assert target.read_bytes().endswith(b"0123456789ab,ok,6\nagain\n")
    assert target.read_bytes().count(HEADER.encode()) == 1


def test_a_file_without_its_header_is_all_bad_lines(tmp_path):
    path = tmp_path / "training.csv"
    path.write_text("a,b\n1,2\n")
    read = split_lines(path, ("phase", "step"), check)
    assert read.header is None and read.good == [] and len(read.bad) == 2
