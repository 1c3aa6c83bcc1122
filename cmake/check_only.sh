#!/bin/sh
# Compiler launcher of the targets that are only checked, never linked (tests/CMakeLists.txt,
# gradcomp_check_only): runs the compile, whose compiler stops after the front end
# (-fsyntax-only), then leaves an empty file where the object would be, so that the build
# reruns the check only when a source changes.
object=
previous=
for argument in "$@"; do
  [ "$previous" = -o ] && object=$argument
  previous=$argument
done
"$@" || exit
[ -z "$object" ] || : >"$object"
