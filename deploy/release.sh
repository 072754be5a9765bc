#!/usr/bin/env bash
# Bumps pdbmux's version and tags the release: `make patch`, `make minor`, `make major`.
#
# Usage: deploy/release.sh patch|minor|major
#
# The version lives in one place: `version` under [workspace.package] in Cargo.toml, which every
# crate inherits, so `cargo build` and `make build` (PDBMUX_BUILD_VERSION) both report it in
# `pdbmux version`. This script refuses unless the working tree is clean (no modified, staged or
# untracked files) and HEAD is on a branch; then it writes the new version into Cargo.toml and
# Cargo.lock (`cargo update --workspace --offline`, which touches only the workspace's own
# entries), checks cargo now reports it for the pdbmux package, commits the two files as
# "Release vX.Y.Z" and creates the annotated tag vX.Y.Z on that commit. It never pushes: push with
# `git push --follow-tags` (or `git push origin vX.Y.Z`); the tag starts .woodpecker/docker.yaml.
set -euo pipefail

part=${1:-}
case $part in
  patch | minor | major) ;;
  *) echo "usage: $0 patch|minor|major" >&2; exit 2 ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CARGO=${CARGO:-cargo}
die() { echo "release: $*" >&2; exit 1; }

git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "not a git work tree"
dirty=$(git status --porcelain --untracked-files=normal)
if [[ -n $dirty ]]; then
  echo "$dirty" >&2
  die "the working tree is not clean: commit or stash first (nothing was changed)"
fi
branch=$(git symbolic-ref --quiet --short HEAD) || die "HEAD is detached: release from a branch"

current=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
[[ $current =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] ||
  die "Cargo.toml [workspace.package] version '$current' is not MAJOR.MINOR.PATCH"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} patch=${BASH_REMATCH[3]}
case $part in
  patch) next="$major.$minor.$((patch + 1))" ;;
  minor) next="$major.$((minor + 1)).0" ;;
  major) next="$((major + 1)).0.0" ;;
esac
tag="v$next"
git rev-parse --quiet --verify "refs/tags/$tag" >/dev/null && die "tag $tag already exists"

restore() { git checkout --quiet -- Cargo.toml Cargo.lock; }
trap 'restore; die "failed; Cargo.toml and Cargo.lock restored"' ERR

sed -i "/^\[workspace\.package\]/,/^\[/s/^version *= *\"$current\"/version = \"$next\"/" Cargo.toml
"$CARGO" update --workspace --offline --quiet
pkgid=$("$CARGO" pkgid --offline -p pdbmux-runtime-tokio) # e.g. path+file:///…/runtime-tokio#pdbmux-runtime-tokio@1.2.3
reported=${pkgid##*[@#]}
[[ $reported == "$next" ]] || { restore; die "cargo reports pdbmux-runtime-tokio $reported, not $next"; }
changed=$(git diff --name-only | sort | tr '\n' ' ')
[[ $changed == "Cargo.lock Cargo.toml " ]] || { restore; die "unexpected changes: $changed"; }

git commit --quiet -m "Release $tag" -- Cargo.toml Cargo.lock
trap - ERR
git tag -a "$tag" -m "pdbmux $next"
echo "release: $current -> $next on $branch: committed \"Release $tag\" ($(git rev-parse --short HEAD)) and tagged $tag"
echo "release: nothing was pushed; publish with: git push --follow-tags"
