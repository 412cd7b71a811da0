/*
 * Chapter 9's memory calculator, computed in the page: a port of gpuformer_lib/memory.py's
 * layer_activation_bytes, training_memory and predicted_peak (with loss_transient_bytes and
 * layer_backward_bytes), and of viz.memory_report_html, so the calculator works in the static book,
 * where no kernel runs. gpuformer_lib.viz.memory_calculator embeds this file in the page with the data
 * computed in Python (each model's exact parameter count, its sizes, the precisions, the GPUs).
 *
 * Ports only the branches the calculator's controls reach: no dropout, CUDA autocast, gradients as wide
 * as the weights, n_layers >= 1, no count_loss_temporaries. Integer arithmetic in doubles is exact below
 * 2^53; memory_calculator checks that every value it can show, times 100 (the bars' widths), stays below.
 * Floor divisions and Python's rounding of "{:.2f}" (ties to even, where toFixed rounds them up) are
 * reproduced exactly: tests/test_memory_calculator_js.py compares every row, byte for byte, and the HTML,
 * character for character, with the Python on a grid of every control value.
 *
 * Plain ES2017, no dependencies. In Node, require() returns the API; in a page it is a local variable of
 * the script that memory_calculator writes.
 */
var gpuformerMemoryCalculator = (function () {
  "use strict";

  var GIB = 1073741824;  // 2**30

  // Python's a // b for ints a >= 0, b >= 1; exact where Math.floor(a / b) can round up near 2^53
  function floorDiv(a, b) {
    return (a - a % b) / b;
  }

  // Python's format(x, "." + digits + "f"): the double's exact value rounded, ties to even. toFixed is
  // exact too but breaks ties upwards; x lies exactly halfway iff x * 2^(digits + 1) is an odd integer.
  function formatFixed(x, digits) {
    var negative = x < 0 || (x === 0 && 1 / x < 0);  // Python keeps the sign of -0.0
    var magnitude = Math.abs(x);
    var text = magnitude.toFixed(digits);
    var doubled = magnitude * Math.pow(2, digits + 1);  // exact: a power of two
    if (Number.isInteger(doubled) && doubled % 2 === 1) {
      var last = text.charCodeAt(text.length - 1) - 48;
      if (last % 2 === 1) {  // toFixed took the odd neighbour above: the even one is one unit below
        text = text.slice(0, -1) + String(last - 1);
      }
    }
    return (negative ? "-" : "") + text;
  }

  // Python's round(x) for x >= 0: the nearest integer, ties to even
  function pyRound(x) {
    var floor = Math.floor(x), rest = x - floor;
    if (rest > 0.5 || (rest === 0.5 && floor % 2 === 1)) {
      return floor + 1;
    }
    return floor;
  }

  // Python's html.escape(text, quote=True)
  function escapeHtml(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
  }

  // memory.layer_activation_bytes without dropout, autocast_device="cuda"
  function layerActivationBytes(s) {
    var C = s.d_model, H = s.n_heads, T = s.seq_len, B = s.batch_size, F = s.d_ff, ab = s.activation_bytes;
    var residual = s.autocast ? 4 : ab;
    var tokens = T * B;
    var total = tokens * (2 * C * residual + (6 * C + 2 * F) * ab);
    if (s.fused_attention) {
      total += 4 * H * tokens;
    } else if (s.autocast && ab < 4) {
      total += H * T * tokens * (4 + ab);  // float32 softmax output + its 16-bit copy
    } else {
      total += 2 * H * T * tokens * ab;
    }
    if (s.autocast) {
      total += 2 * (4 * C * C + 2 * C * F);  // bf16/fp16 copies of the matrices
    }
    return total;
  }

  // memory.training_memory(n_params, **s): the rows of a TrainingMemory, in its order
  function trainingMemory(nParams, s) {
    var layer = layerActivationBytes(s);
    var tokens = s.seq_len * s.batch_size;
    var residual = s.autocast ? 4 : s.activation_bytes;
    var head = tokens * (s.d_model * (residual + s.activation_bytes) + 4 * s.vocab_size);
    if (s.autocast) {
      head += 2 * s.vocab_size * s.d_model;  // 16-bit copy of the output projection
    }
    var activations, recomputed;
    if (s.checkpointing) {
      activations = s.n_layers * tokens * s.d_model * residual + head;
      recomputed = layer;
    } else {
      activations = s.n_layers * layer + head;
      recomputed = 0;
    }
    var rows = {
      weights: floorDiv(nParams * s.param_bytes, s.shard_weights),
      gradients: floorDiv(nParams * s.param_bytes, s.shard_gradients),
      optimizer: floorDiv(nParams * s.optimizer_state_bytes, s.shard_optimizer),
      master_weights: s.master_weights ? floorDiv(nParams * 4, s.shard_optimizer) : 0,
      activations: activations,
      recomputed: recomputed,
      loss_temporaries: 0
    };
    rows.total = rows.weights + rows.gradients + rows.optimizer + rows.master_weights + rows.activations +
      rows.recomputed + rows.loss_temporaries;
    return rows;
  }

  // memory.predicted_peak(n_params, **s): the saved rows, the three moments, the one that sets the peak
  function predictedPeak(nParams, s) {
    var saved = trainingMemory(nParams, s);
    var ab = s.activation_bytes;
    var tokens = s.seq_len * s.batch_size;
    var logits = tokens * s.vocab_size;
    // memory.loss_transient_bytes, autocast_device="cuda": in 16 bits log-softmax runs in 16 bits and NLL
    // keeps a float32 copy, so the loss's backward holds the 16-bit log-probs and NLL's float32 gradient
    var lossForward = ab < 4 ? logits * 2 * ab : logits * ab;
    var lossBackward = ab < 4 ? logits * (ab + 4) : logits * 8;
    var layerBackward = tokens * (2 * s.d_ff * ab + 2 * s.d_model * 4);
    if (!s.fused_attention) {
      layerBackward += 2 * s.n_heads * s.seq_len * tokens * ab;
    }
    var moments = [
      ["loss forward", saved.activations + lossForward],
      ["loss backward", saved.activations + lossBackward],
      ["layer backward", saved.activations - 4 * logits + saved.recomputed + layerBackward]
    ];
    var moment = moments[0];
    for (var i = 1; i < moments.length; i++) {
      if (moments[i][1] > moment[1]) {
        moment = moments[i];  // the first of equal moments wins, as Python's max does
      }
    }
    var states = saved.weights + saved.gradients + saved.optimizer + saved.master_weights;
    return {saved: saved, moments: moments, moment: moment[0], peak: states + moment[1]};
  }

  // viz.memory_report_html(memory, gpuGib, title, peak)
  function reportHtml(peak, gpuGib, title) {
    var saved = peak.saved;
    var names = ["weights", "gradients", "optimizer", "master_weights", "activations", "recomputed",
      "loss_temporaries"];
    var shown = names.filter(function (name) { return !(name === "loss_temporaries" && saved[name] === 0); })
      .map(function (name) { return [name, saved[name]]; });
    shown.push(["saved tensors (the sum above)", saved.total]);
    shown.push(["predicted peak (at the " + peak.moment + ")", peak.peak]);
    if (gpuGib) {
      shown.push(["the GPU's memory", pyRound(gpuGib * GIB)]);
    }
    // every bar on one scale, the largest row's, so the peak's bar and the GPU's can be compared at a glance
    var scale = Math.max(1, Math.max.apply(null, shown.map(function (row) { return row[1]; })));
    var rows = shown.map(function (row) {
      var name = row[0], value = row[1];
      var colour = name.indexOf("predicted peak") === 0 ? "#c44e52" : name === "the GPU's memory" ? "#8c8c8c"
        : name === "saved tensors (the sum above)" ? "" : "#4c72b0";
      var bar = colour
        ? '<div style="background:' + colour + ';height:0.8em;width:' +
          formatFixed(Math.min(100 * value / scale, 100), 1) + '%"></div>'
        : "";
      return "<tr><td>" + name.replace(/_/g, " ") + "</td><td style='text-align:right;white-space:nowrap'>" +
        formatFixed(value / GIB, 2) + " GiB</td><td style='width:50%'>" + bar + "</td></tr>";
    });
    var verdict = "";
    if (gpuGib) {
      var spare = gpuGib - peak.peak / GIB;
      verdict = spare > 0
        ? "<p>Fits in " + formatFixed(gpuGib, 1) + " GiB with " + formatFixed(spare, 1) + " GiB to spare " +
          "(before the CUDA context, about 0.5 GiB, and the allocator's fragmentation).</p>"
        : "<p><b>Does not fit</b> in " + formatFixed(gpuGib, 1) + " GiB: " + formatFixed(-spare, 1) + " GiB over.</p>";
    }
    var head = title ? "<p><b>" + title + "</b></p>" : "";
    return head + "<table>" + rows.join("") + "</table>" + verdict;
  }

  // viz.calculator_settings: training_memory's arguments for one setting of the controls
  function settingsFor(data, choice) {
    var model = data.models[choice.model];
    var precision = data.precisions[choice.precision];
    var stage = choice.sharding;
    var ranks = stage ? choice.ranks : 1;
    return {
      n_layers: model.n_layers, d_model: model.d_model, n_heads: model.n_heads, d_ff: model.d_ff,
      vocab_size: model.vocab_size, seq_len: choice.seq_len, batch_size: choice.batch_size,
      optimizer_state_bytes: data.optimizer_state_bytes[choice.optimizer],
      fused_attention: choice.fused_attention, checkpointing: choice.checkpointing,
      shard_optimizer: stage >= 1 ? ranks : 1, shard_gradients: stage >= 2 ? ranks : 1,
      shard_weights: stage >= 3 ? ranks : 1,
      param_bytes: precision.param_bytes, activation_bytes: precision.activation_bytes,
      autocast: precision.autocast, master_weights: precision.master_weights
    };
  }

  // viz.calculator_title
  function titleFor(data, choice) {
    return escapeHtml(choice.model) + ": " + formatFixed(data.models[choice.model].n_params / 1e6, 0) +
      " M parameters, " + choice.batch_size + " x " + choice.seq_len + " tokens per micro-batch, per GPU";
  }

  // the whole result for one setting of the controls: what memory_calculator renders in Python
  function compute(data, choice) {
    var peak = predictedPeak(data.models[choice.model].n_params, settingsFor(data, choice));
    return {peak: peak, html: reportHtml(peak, data.gpus[choice.gpu], titleFor(data, choice))};
  }

  // the controls' values, by their data-control names
  function readChoice(root) {
    function control(name) { return root.querySelector("[data-control='" + name + "']"); }
    return {
      model: control("model").value,
      batch_size: parseInt(control("batch_size").value, 10),
      seq_len: parseInt(control("seq_len").value, 10),
      precision: control("precision").value,
      optimizer: control("optimizer").value,
      fused_attention: control("fused_attention").checked,
      checkpointing: control("checkpointing").checked,
      sharding: parseInt(control("sharding").value, 10),
      ranks: parseInt(control("ranks").value, 10),
      gpu: control("gpu").value
    };
  }

  // Wire one calculator: its root is the element of class gpuformer-memcalc around `script` (so a page
  // showing the same output twice works), else the element with id rootId. Enables the controls (the
  // page is sent with them disabled, for where no script runs) and recomputes on every change.
  function mount(script, rootId, data, attempt) {
    var root = (script && script.closest && script.closest(".gpuformer-memcalc")) || document.getElementById(rootId);
    if (!root) {  // not in the document yet (an output being attached): try again shortly
      if ((attempt || 0) < 100) {
        setTimeout(function () { mount(null, rootId, data, (attempt || 0) + 1); }, 50);
      }
      return;
    }
    if (root.getAttribute("data-mounted") === "yes") {
      return;
    }
    root.setAttribute("data-mounted", "yes");
    var result = root.querySelector(".gpuformer-memcalc-result");
    var batchShown = root.querySelector("[data-shows='batch_size']");
    var note = root.querySelector(".gpuformer-memcalc-static-note");
    var ranks = root.querySelector("[data-control='ranks']");
    function update() {
      var choice = readChoice(root);
      if (batchShown) {
        batchShown.textContent = String(choice.batch_size);
      }
      if (ranks) {
        ranks.disabled = choice.sharding === 0;  // nothing is sharded: the ranks do not count
      }
      result.innerHTML = compute(data, choice).html;
    }
    var controls = root.querySelectorAll("[data-control]");
    for (var i = 0; i < controls.length; i++) {
      controls[i].disabled = false;
    }
    if (note) {
      note.parentNode.removeChild(note);
    }
    root.addEventListener("input", update);
    root.addEventListener("change", update);
    update();  // the browser may have restored other values than the ones the page was sent with
  }

  return {
    floorDiv: floorDiv, formatFixed: formatFixed, escapeHtml: escapeHtml, pyRound: pyRound,
    layerActivationBytes: layerActivationBytes, trainingMemory: trainingMemory, predictedPeak: predictedPeak,
    reportHtml: reportHtml, settingsFor: settingsFor, titleFor: titleFor, compute: compute, mount: mount
  };
}());

if (typeof module === "object" && module && module.exports) {
  module.exports = gpuformerMemoryCalculator;
}
