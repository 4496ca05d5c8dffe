#!/usr/bin/env bash
# Runs the issue-38 tests (docs/security.md, "Does each test fail before its
# fix?") on the code before the fixes: a detached worktree of 12d8d2d (the
# base of the security branch), docs/issue38-before.patch applied (the tests
# copied there and the old-API variants), built and run. Every test it runs is
# expected to FAIL there. Not a CI step: it builds three packages of an old
# tree (tens of minutes on 2 cores).
#   scripts/issue38-before.sh [DIR]   (default /tmp/surge-issue38-before)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/surge-issue38-before}
[ -d "$dir" ] || git worktree add --detach "$dir" 12d8d2d
git -C "$dir" apply --check "$PWD/docs/issue38-before.patch" 2>/dev/null && git -C "$dir" apply "$PWD/docs/issue38-before.patch"
cd "$dir"
cargo test --release --locked -p surge-block -p surge-cloud -p surge-nbd -p surge-bb -p surge --lib --bins --tests --no-run
tests=(
  "-p surge-nbd --lib overlapping_hole_chunks_beyond_the_reads_coverage_are_refused"
  "-p surge-nbd --lib block_status_descriptors_stop_at_the_requests_coverage_over_all_chunks"
  "-p surge-nbd --test tls remote_device_presents_the_client_certificate_in_its_tls_directory"
  "-p surge-nbd --test limits_old old_api_"
  "-p surge-block --lib created_files_are_readable_by_their_owner_only"
  "-p surge-block --lib huge_credits_from_peers_saturate_instead_of_overflowing"
  "-p surge-block --lib old_api_senders_cannot_grow_the_ledger"
  "-p surge-cloud --lib volume_and_state_files_are_created_private"
  "-p surge-bb --lib spilled_chunks_are_readable_by_the_node_only"
  "-p surge-bb --test client_api the_buckets_internal_prefix_is_reserved_at_the_root"
  "-p surge-bb --test client_api files_past_the_largest_object_fail_with_efbig"
  "-p surge --bin surge the_control_socket_is_private_and_an_endless_line_is_cut"
  "-p surge --bin surge a_client_that_never_reads_does_not_freeze_other_scrapes"
  "-p surge --bin surge old_api_pool_nodes_do_not_get_the_redis_password_in_their_arguments"
  "-p surge --bin surge everything_else_is_reported_as_needing_a_restart"
  "-p surge --bin surge tls_require_satisfies_the_exposure_rule_and_allow_does_not"
  "-p surge --bin surge the_sample_service_config_plans"
  "-p surge --bin surge old_api_coop_and_metrics_listeners_off_loopback_need_their_own_guard"
  "-p surge --test security non_loopback_listeners_need_tls_require_or_insecure"
  "-p surge --test security sighup_reloads_the_tls_certificates"
  "-p surge --test bb nodes_and_mounts_with_a_tls_dir_serve_and_others_are_refused"
  "-p surge --test bb the_internal_prefix_and_huge_sizes_are_refused_through_the_mount"
  "-p surge --test bb a_sparse_file_is_written_back_without_uploading_its_holes"
)
passed=0
for t in "${tests[@]}"; do
  # shellcheck disable=SC2086
  if cargo test --release --locked $t -- --test-threads 1 >/tmp/issue38-before.log 2>&1; then
    echo "PASSES BEFORE (does not test its fix): $t"; passed=$((passed + 1))
  else
    echo "fails before: $t ($(grep -m1 -A1 panicked /tmp/issue38-before.log | tail -1 | cut -c1-120))"
  fi
done
[ "$passed" = 0 ]
