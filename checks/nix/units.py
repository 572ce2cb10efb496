#!/usr/bin/env python3
"""Write the systemd units checks/nix/eval.nix rendered (JSON on stdin) as unit files in DIR,
the way NixOS writes them: a list becomes one line per item (so SystemCallFilter's allow and
deny lines stay apart), a boolean becomes yes/no. Prints each unit's name and whether it runs
as root (no User=), one per line: `<file> root|user`."""

import json
import sys


def value(v):
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def section(name, items):
    lines = [f"[{name}]"]
    for key, v in items:
        for item in v if isinstance(v, list) else [v]:
            lines.append(f"{key}={value(item)}")
    return lines


def main():
    out = sys.argv[1]
    data = json.load(sys.stdin)
    for kind, units in (("service", data["services"]), ("timer", data["timers"])):
        for name, unit in sorted(units.items()):
            unit_keys = [("Description", unit.get("description", name))]
            for key, nix in (("After", "after"), ("Before", "before"), ("Wants", "wants")):
                if unit.get(nix):
                    unit_keys.append((key, " ".join(unit[nix])))
            body = section("Unit", unit_keys)
            config = unit.get("serviceConfig" if kind == "service" else "timerConfig", {})
            body += section(kind.capitalize(), sorted(config.items()))
            if unit.get("wantedBy"):
                body += section("Install", [("WantedBy", " ".join(unit["wantedBy"]))])
            path = f"{out}/{name}.{kind}"
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(body) + "\n")
            if kind == "service":
                print(path, "user" if "User" in config else "root")


main()
