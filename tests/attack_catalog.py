"""Every attack tried on vflo, what now happens, and the tests that try it: the source of the table in
docs/security.md (``python -m benchmarks.attacks_table`` runs the tests and writes it; ``tests/test_attack_catalog.py``
checks that the page lists exactly these, and that each test named exists)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attack:
    surface: str
    attack: str
    outcome: str
    tests: tuple[str, ...]


ATTACKS: tuple[Attack, ...] = (
    Attack("the PSI library's link",
           "a plain-text HTTP push, a TLS client without a certificate, a foreign CA's certificate and another "
           "party's certificate on the link's port, and a stranger pushing into it during a run",
           "refused by vflo's mutual-TLS relay before any byte reaches the library; the library listens on a Unix "
           "socket in the side's 0700 folder; the run completes",
           ("tests/test_psi_link_tls.py", "tests/e2e/test_psi_link_attacks.py")),
    Attack("SecureBoost's splits",
           "the label holder asks one node's split again and again (775 times at the root), or a node that does "
           "not exist, to read every person's bin in every column",
           "a partner answers each node of the tree being grown once, keeps only the chosen split, and sends its "
           "candidates shuffled per node; repeats and unknown nodes are refused",
           ("tests/test_secureboost_order.py::test_a_partner_records_one_split_per_node_and_only_for_nodes_the_tree_has",
            "tests/test_secureboost_order.py::test_the_repeated_root_attack_is_refused_and_leaves_one_split_to_score_with",
            "tests/test_secureboost_order.py::test_after_training_a_partners_table_holds_the_splits_of_the_trees_alone",
            "tests/e2e/test_secureboost_attacks.py::test_a_deployed_partner_answers_the_roots_split_once")),
    Attack("noise that averages away",
           "a coordinator repeats validation passes of a noised SplitNN party within a run, or runs again and again "
           "with fresh release keys across restarts",
           "each person is released at most once per declared epoch; a deployed party has a budget by default "
           "(ε 8, δ 1e-5) whose account a restart continues",
           ("tests/test_safe_defaults.py::test_a_coordinator_repeating_validation_passes_is_refused_by_a_noised_splitnn_party",
            "tests/test_safe_defaults.py::test_a_noised_bottom_releases_each_person_once_per_declared_epoch",
            "tests/test_safe_defaults.py::test_a_deployed_party_without_privacy_gets_the_default_budget",
            "tests/test_safe_defaults.py::test_a_restarted_party_continues_its_privacy_account",
            "tests/e2e/test_privacy_account.py")),
    Attack("certificate names",
           "the lab's certificate request carries the extra name 'hospital' before the hospital is signed; a peer "
           "drops the first connection, or shows the client's probe another certificate, to take a message meant "
           "for the hospital",
           "the CA refuses any request naming another party on its roster, in any spelling, signed or not, and a "
           "revoked key; a client sends nothing to a party whose certificate it has not read, and pins the channel "
           "to that certificate",
           ("tests/test_roster.py::test_the_ca_refuses_a_name_of_a_party_it_has_not_signed_yet",
            "tests/test_roster.py::test_a_revoked_key_does_not_come_back",
            "tests/test_roster.py::test_a_peer_that_drops_the_first_connection_gets_nothing",
            "tests/test_roster.py::test_a_peer_whose_certificate_cannot_be_read_is_sent_nothing",
            "tests/test_roster.py::test_a_peer_that_shows_the_probe_another_certificate_gets_nothing")),
    Attack("floods",
           "a certificate holder who is no peer sends 254 MiB frames and slow calls; a peer holds many calls and "
           "bytes at once",
           "a non-peer is refused from its certificate before its message is read; each peer is bounded in calls, "
           "bytes in flight and arrival time ([policy]); other peers are still answered",
           ("tests/test_peer_bounds.py", "tests/e2e/test_peer_bounds.py",
            "tests/e2e/test_attacks.py::test_under_the_resource_attacks_a_party_stays_under_its_ceiling_and_keeps_serving")),
    Attack("helper processes",
           "a local user plants pickle.py in a party's working folder or on PYTHONPATH",
           "helpers run in Python's isolated mode: nothing planted there is imported",
           ("tests/test_helpers_isolated.py",)),
    Attack("files and terminals",
           "other users of a party's host read its kept alignments, exports, spill files, saved parts and privacy "
           "account; a peer puts terminal escapes and rich markup in a message kind the audit prints",
           "everything vflo writes that holds IDs, rows, labels, keys or models is 0600 in 0700 folders; the "
           "export's CA goes beside it, never inside; peer text is printed escaped",
           ("tests/test_safe_defaults.py::test_an_export_is_private_keeps_the_ca_outside_and_carries_a_budget",
            "tests/test_safe_defaults.py::test_spill_files_kept_alignments_and_saved_parts_are_their_owners_only",
            "tests/test_safe_defaults.py::test_party_audit_shows_a_peers_escapes_and_markup_as_text",
            "tests/test_safe_defaults.py::test_an_error_with_a_peers_escapes_is_printed_as_text")),
    Attack("plain alignment by default",
           "a newcomer's deployment sends every active-party ID, people the partner does not hold included",
           "a deployment aligns by PSI unless its config asks for plain and every partner's policy accepts it; "
           "the run says what its alignment revealed to whom",
           ("tests/test_safe_defaults.py::test_a_deployed_run_with_the_defaults_sends_no_id_in_the_clear",
            "tests/test_safe_defaults.py::test_plain_alignment_runs_only_where_the_partner_accepts_it_and_is_logged",
            "tests/test_safe_defaults.py::test_a_deployed_experiment_without_alignment_aligns_by_psi_with_the_auto_engine")),
    Attack("hand-written cryptography",
           "vflo's eight-lane X25519 kernel could differ from OpenSSL, leak its key through timing, or read out of "
           "bounds",
           "a million recorded and 100,000 fresh OpenSSL pairs agree, edge and small-order points included; "
           "dudect-style timing finds no dependence on key or point; sanitizer builds report nothing",
           ("tests/test_curve_differential.py", "tests/test_curve_constant_time.py", "tests/test_curve_sanitizers.py")),
    Attack("a malicious server or dealer",
           "FedSVD's server sets identity masks and V = I to read a party's block; the dealer drains a party's "
           "ledger and tears its method down",
           "refused; nothing but an error line comes back, and the real run completes with the same scores",
           ("tests/e2e/test_attacks.py::test_a_malicious_server_gets_nothing_while_the_real_run_completes",
            "tests/test_security.py::test_the_fedsvd_exfiltration_by_a_malicious_server_is_refused_and_the_run_completes")),
    Attack("a passive party or stranger driving another",
           "a passive party sets up or drives another; a stranger with a certificate sends before any handler runs",
           "refused naming sender, role and kind; the running method is untouched",
           ("tests/e2e/test_attacks.py::test_a_passive_party_cannot_set_up_another",
            "tests/test_security.py::test_a_passive_party_cannot_set_up_or_drive_another",
            "tests/test_security.py::test_a_stranger_is_refused_before_any_handler_runs")),
    Attack("vflo serve's port",
           "whoever reaches the port asks for anyone's scores or swaps the model; a server configured to listen "
           "beyond loopback in plain HTTP; a token file other users can read; a 5 MiB body",
           "every route but the probes needs the serve token (written 0600 at first start), a swap a second admin "
           "token (off without one), or client certificates with auth = 'mtls'; beyond loopback only with TLS "
           "unless insecure_listen is named; a token file others may read is refused; bodies are bounded (413)",
           ("tests/test_serve.py::test_only_the_probes_answer_without_the_token_and_a_swap_needs_the_admin_token",
            "tests/test_serve.py::test_a_server_reachable_from_elsewhere_needs_tls_and_a_token_file_its_owners_alone",
            "tests/e2e/test_serve_tls.py")),
    Attack("vflo explore's per-bin sums",
           "the label holder asks a partner for the per-bin label sums of its columns while the partner's policy "
           "leaves explore off; asks again, about people that differ by one, to place that person in a bin; asks "
           "about a handful of people so that a bin describes a few; makes a partner drop its columns in the middle "
           "of a run; reads who it shares with the partner from what comes back; asks over people it names from a "
           "partner whose policy keeps that to a count",
           "refused unless the partner's [policy] explore = true; each peer answered explore_answers times (1) while "
           "the partner runs; no bin released with fewer than min_bin_rows people (50), smaller ones merged, the "
           "people missing a value withheld, and no sums at all over fewer shared people; columns are dropped by the "
           "partner's own policy, between runs only; by default (explore_shared = 'count') the partner matches "
           "blinded IDs and nothing that comes back names a person; a request over named people refused unless "
           "explore_shared = 'ids'",
           ("tests/test_explore.py::test_a_partner_answers_only_where_its_policy_says_so",
            "tests/test_explore.py::test_by_default_the_label_holder_learns_how_many_it_shares_and_never_who",
            "tests/test_explore.py::test_a_partner_whose_policy_keeps_who_is_shared_refuses_to_answer_over_named_people",
            "tests/test_explore.py::test_blinded_sums_come_only_after_the_points_and_over_at_least_min_bin_rows_people",
            "tests/test_explore.py::test_a_partner_answers_each_peer_only_as_often_as_its_policy_says",
            "tests/test_explore.py::test_a_partners_bins_hold_at_least_its_minimum",
            "tests/test_explore.py::test_a_node_refuses_to_drop_columns_during_a_run",
            "tests/e2e/test_explore_deployed.py")),
    Attack("a coordinator choosing a party's computation",
           "the coordinator proposes settings outside a party's policy, or its own choice of the party's side",
           "refused before anything runs; a party's own settings run whatever is proposed",
           ("tests/e2e/test_attacks.py::test_a_malicious_coordinator_cannot_choose_the_lab_s_computation",
            "tests/e2e/test_attacks.py::test_a_method_outside_a_partys_policy_is_refused_before_anything_runs")),
    Attack("replaying the run seed",
           "a server recomputes a client's projection or the dealer's masks from the public run seed",
           "recovers nothing: a party's secrets come from its own seed or the OS",
           ("tests/test_secrets.py::test_over_grpc_a_semi_honest_server_cannot_replay_a_clients_projection",
            "tests/test_secrets.py::test_over_grpc_the_server_cannot_recompute_the_dealers_masks")),
    Attack("steps out of order",
           "another run's messages, rounds that go backwards, masks replaced mid-run, steps out of order",
           "refused",
           ("tests/test_security.py::test_one_run_at_a_time_other_runs_and_backward_rounds_are_refused",
            "tests/test_security.py::test_steps_out_of_order_are_refused",
            "tests/test_security.py::test_masks_and_v_cannot_be_replaced_mid_run")),
)


def tests_cell(attack: Attack) -> str:
    """The tests of ``attack`` as the page names them: ``file::test``, or a whole file."""
    return "<br>".join(f"`{t}`" for t in attack.tests)


def table(results: dict[str, str] | None = None) -> str:
    """The page's table: one row per attack; ``results``, by surface, the outcome of its tests' last run."""
    head = ["| surface | attack tried | what happens now | tests | last run |", "|---|---|---|---|---|"]
    body = [f"| {a.surface} | {a.attack} | {a.outcome} | {tests_cell(a)} | {(results or {}).get(a.surface, '')} |"
            for a in ATTACKS]
    return "\n".join(head + body)
