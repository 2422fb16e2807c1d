#!/usr/bin/env bash
# The code a gpu-pool job runs: the commit that launched the pipeline, not the one baked into the image.
#
# Run by the npr-stage deployment's pull step (prefect.yaml). Reads NPR_GIT_COMMIT / NPR_GIT_REMOTE (set by
# the pipeline flow for each gpu stage) and NPR_REPO_DIR (the checkout baked into the image, or a local
# worker's own checkout). Prints the directory to run in on stdout (its only stdout line); git's output
# goes to stderr. The flow then runs there, and flows/stage.py puts that directory first on PYTHONPATH,
# so `npr stage` imports this commit's code.
#
# The DVC remote: the launching machine's user bucket is in its .dvc/config.local, which never reaches the
# image. The flow sends the remote it resolves as NPR_DVC_REMOTE (name), NPR_DVC_REMOTE_URL and
# NPR_DVC_REMOTE_ENDPOINTURL / _REGION (components/storage.py, remote_forwarding; never credentials: those
# come from the pod's secret), and they are written to the run directory's .dvc/config.local here.
set -euo pipefail

repo="${NPR_REPO_DIR:-/opt/npr}"
commit="${NPR_GIT_COMMIT:-}"
remote="${NPR_GIT_REMOTE:-}"
root="${NPR_CHECKOUT_ROOT:-${TMPDIR:-/tmp}/npr-checkouts}"

# The launching machine's DVC remote, as this job's default remote in the directory it runs in ($1).
use_forwarded_remote() {
  local dir="$1" name="${NPR_DVC_REMOTE:-}" dvc
  [ -n "${NPR_DVC_REMOTE_URL:-}" ] || return 0
  if [ -z "$name" ]; then
    echo "checkout: NPR_DVC_REMOTE_URL is set without NPR_DVC_REMOTE (the remote's name)" >&2
    exit 2
  fi
  dvc="$(command -v dvc || echo "$repo/.venv/bin/dvc")"
  (cd "$dir" && "$dvc" remote add --local --force --default "$name" "$NPR_DVC_REMOTE_URL") >&2
  for option in endpointurl region; do
    local var="NPR_DVC_REMOTE_${option^^}"
    if [ -n "${!var:-}" ]; then (cd "$dir" && "$dvc" remote modify --local "$name" "$option" "${!var}") >&2; fi
  done
  echo "checkout: DVC remote $name = $NPR_DVC_REMOTE_URL (from the launching machine)" >&2
}

if [ -z "$commit" ]; then
  echo "checkout: no NPR_GIT_COMMIT given; running the code in $repo" >&2
  use_forwarded_remote "$repo"
  echo "$repo"
  exit 0
fi
# NPR_CHECKOUT_PERSISTENT=1 (the GPU image): always a checkout under the root, which is the work volume, so
# the stage's artifacts/<stage>/work outlives the pod; otherwise the image's own copy serves when it is the commit
if [ "${NPR_CHECKOUT_PERSISTENT:-0}" != 1 ] \
  && [ "$(git -C "$repo" rev-parse HEAD 2>/dev/null || true)" = "$commit" ] \
  && [ -z "$(git -C "$repo" status --porcelain --untracked-files=no -- . ':!params.yaml' ':!dvc.lock' 2>/dev/null || echo dirty)" ]; then
  echo "checkout: $repo is at $commit" >&2
  use_forwarded_remote "$repo"
  echo "$repo"
  exit 0
fi
dest="$root/$commit"
if [ ! -d "$dest/.git" ]; then
  source="${remote:-$repo}"
  if [ -z "$remote" ] && ! git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "checkout: commit $commit is not in $repo and NPR_GIT_REMOTE is not set" >&2
    exit 2
  fi
  mkdir -p "$root"
  tmp="$(mktemp -d "$root/.clone-XXXXXX")"
  git clone --quiet --no-checkout "$source" "$tmp" >&2
  git -C "$tmp" -c advice.detachedHead=false checkout --quiet --detach "$commit" >&2
  # this machine's DVC remote settings (.dvc/config.local, never committed) come along
  if [ -f "$repo/.dvc/config.local" ]; then cp "$repo/.dvc/config.local" "$tmp/.dvc/config.local"; fi
  mv "$tmp" "$dest" 2>/dev/null || rm -rf "$tmp"  # a concurrent job may have made it first
fi
use_forwarded_remote "$dest"
echo "checkout: running commit $commit in $dest" >&2
echo "$dest"
