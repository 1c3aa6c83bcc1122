"""What the test command ran, what it skipped and why: reads the JUnit files that ctest
(--output-junit) and pytest (--junitxml) wrote, and prints one line per suite.

    python3 scripts/test_summary.py NAME=FILE.xml ...
"""
import sys
import xml.etree.ElementTree as ET


def summarize(name, path):
    cases = ET.parse(path).getroot().iter("testcase")
    ran, failed, skipped = 0, [], {}
    for case in cases:
        label = case.get("name")
        skip = case.find("skipped")
        if skip is not None or case.get("status") in ("notrun", "disabled"):
            reason = (skip.get("message") if skip is not None else None) or ""
            out = case.find("system-out")
            text = out.text.strip().splitlines() if out is not None and out.text else []
            if "skipped" in " ".join(text[-2:]).lower():
                reason = text[-1]
            skipped.setdefault(reason or "no reason given", []).append(label)
        elif case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
            failed.append(label)
        else:
            ran += 1
    line = f"{name}: {ran} passed"
    if failed:
        line += f", {len(failed)} FAILED ({', '.join(failed)})"
    for reason, names in skipped.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        line += f"; {len(names)} skipped ({reason}): {shown}"
    print(line)


if __name__ == "__main__":
    print("== what ran")
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        summarize(name, path)
