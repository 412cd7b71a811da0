"""Chapter 0's prose against the review's findings: each test would have caught one of the errors it listed."""

import re

import notebook_pages as pages


def markdown(name: str) -> str:
    return pages.text(pages.load_cells(name), "markdown")


def outputs(name: str) -> str:
    return pages.outputs(pages.load_cells(name))


SETUP = "00_setup.ipynb"


def test_no_promise_of_gpu_results_the_page_does_not_show():
    text = markdown(SETUP)
    assert "can still see GPU results" not in text and "as measured on the GPU each page names" not in text
    # what the page says instead is true of its stored output: a view with the three kinds of number
    shown = outputs(SETUP)
    assert all(kind in shown for kind in ("measured", "predicted", "published"))


def test_missing_native_bf16_is_not_called_slower():
    text = markdown(SETUP) + outputs(SETUP)
    assert "emulated (slower than fp32)" not in text
    assert not re.search(r"emulated on most CPUs and run \*?slower", text)
    assert "oneDNN" in markdown(SETUP)  # the table says where the speed of 16-bit CPU kernels comes from


def test_the_first_timed_call_is_not_said_to_create_the_cuda_context():
    text = markdown(SETUP)
    assert "first call on a GPU pays one-off costs (creating the CUDA context" not in text
    assert "cuBLAS handle" in text and "lazily" in text


def test_seeding_is_not_said_to_make_gpu_runs_repeat_exactly():
    text = markdown(SETUP)
    assert "makes a run repeat exactly" not in text
    assert "warn_only=True" in text and "CUBLAS_WORKSPACE_CONFIG" in text and "atomic" in text


def test_the_sm_row_points_at_a_section_that_exists():
    assert "chapter 2, occupancy and waves" in markdown(SETUP)
    chapter2 = markdown("02_gpu_programming.ipynb").lower()
    assert "occupancy" in chapter2 and "wave" in chapter2


# --------------------------------------------------------------------------- second review of chapter 0


cells = pages.load_cells


def code(name: str) -> str:
    return pages.text(cells(name), "code")


def test_the_article_the_course_started_from_is_pointed_at_for_a_newcomer():
    assert "second of the articles this course started from (see the [introduction](../book/intro.md)" in markdown(SETUP)


def test_no_profile_or_registry_number_is_typed_in_the_prose():
    text = markdown(SETUP)
    for typed in ("14.7 GiB", "79.1 GiB", "12.2 / 11.8", "(7.5, 9.0)", "15,102", "they agree"):
        assert typed not in text, f"{typed!r} is typed in the prose: glue it from the profile or the registry"
    for name in ("t4_profile_gib", "h100_profile_gib", "t4_driver_runtime", "t4_memory_agree", "published_ccs"):
        assert f"{{glue:text}}`{name}`" in text and f'glue("{name}"' in code(SETUP)


def test_host_sync_words_come_from_the_two_loops_comparison():
    assert "device_checks.sync_comparison_words(sync, device.type)" in code(SETUP)
    shown = markdown(SETUP) + outputs(SETUP)
    assert "already synchronous" not in shown
    # the review: a CPU's ratio of 1.10 demonstrated nothing; the page says a CPU cannot show the lesson and
    # points at what the GPU suite measured
    glued = pages.glued(cells(SETUP))
    assert "cannot show what a host sync costs on a GPU" in glued["sync_words"]
    assert "GPU suite measured" in markdown(SETUP) and "{glue:text}`suite_sync`" in markdown(SETUP)
    assert "µs on an NVIDIA H100 80GB HBM3" in glued["suite_sync"]  # a committed GPU result, not a CPU's number
    assert "(x + 1).item()" not in code(SETUP)  # the read loop does the same in-place add as the queued one


def test_the_mismatch_message_is_not_typed_as_the_gpus_wording():
    text = markdown(SETUP)
    assert "{glue:text}`mismatch_form`" in text and "varies" in text
    assert "On a GPU the message reads" not in text


def test_the_gpu_view_labels_what_it_shows():
    shown = outputs(SETUP)
    assert "9.0 (major.minor)" in shown and "9 (major.minor)" not in shown.replace("9.0 (major.minor)", "")
    assert " 1 threads" not in shown and "torch uses" in shown
    assert "one host sync" not in shown and "x.add_(1), then x.item()" in shown
    assert "MBytes are MiB" in shown  # the published MiB converted beside the GiB rows
    # the review: rows read from a profile's memory (total_memory recorded on a real card) were labelled
    # predicted; the memory is now only the predictions' stated basis
    assert "(profile data)" not in shown and "torch's total_memory recorded on a NVIDIA H100 80GB HBM3" in shown


def test_the_t4s_missing_memory_is_put_down_to_ecc_first():
    """The review: the page compared 14.7 GiB with 16e9 bytes and blamed the driver; ECC takes 1/16 of a
    16 GiB T4's GDDR6 (15,360 MiB left), the driver ~258 MiB more."""
    text, source = markdown(SETUP), code(SETUP)
    assert "16e9 / 2**30" not in source and "16 × 10⁹ bytes" not in text
    assert 'figure("gddr-ecc-capacity-reduction")' in source and 'figure("t4-memory-announced")' in source
    assert "ECC, not the driver, takes most" in text
    for name in ("t4_card", "ecc_share", "t4_ecc_mib", "t4_after_ecc_mib", "t4_driver_mib"):
        assert f"{{glue:text}}`{name}`" in text
    glued = pages.glued(cells(SETUP))
    # 16 GiB less 6.25 %, and what deviceQuery's 15,102 MiB leaves of that (both from registered figures)
    assert glued["t4_after_ecc_mib"] == "15,360 MiB" and glued["t4_driver_mib"] == "258 MiB"


def test_no_overclaim_of_exact_agreement_with_pytorch():
    assert "to the digit" not in markdown(SETUP)


def test_the_bigger_model_options_are_judged_in_code_with_room_to_spare():
    source, shown = code(SETUP), outputs(SETUP)
    assert "bring the state under" not in source
    assert "device_checks.state_fit" in source and "not a real fit" in shown and "GiB short" in shown
    assert "GiB left for activations and the CUDA context)" not in shown  # no "(-4.7 GiB left ...)"


def test_at_most_one_exercise_copies_a_formula_and_the_rest_need_thought():
    source = code(SETUP)
    assert "check_supports_bf16(" not in source  # the compute-capability rule copied from the text is gone
    assert "check_precision_choice(answers)" in source  # a diagnosis against profiles.training_precision
    assert "check_read_interval_prediction(" in source  # a prediction that needs a model of the loop
    assert "check_training_state_prediction(" in source
