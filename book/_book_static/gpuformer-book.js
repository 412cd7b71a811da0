/* The course's small additions to every page of the book (loaded through html_js_files in _config.yml).

   1. A wide table, printed table, listing of source code or display equation scrolls inside its box; where it is
      wider than the column, the box gets the class "gpuformer-scrolls", which the stylesheet shows with a shadow
      at the edge and a line saying that it scrolls sideways (a phone hides the scroll bar until the reader
      touches it). Marked again on resize, and once MathJax has typeset the equations.
   2. Search over file://: the browser refuses the requests that fetch each result's excerpt, so there the
      excerpts are left out (no failed requests, no console errors) and the search page says to serve the
      folder for them. */
(function () {
  "use strict";
  var BOXES = "article .pst-scrollable-table-container, article .cell_output .output.text_html, " +
              "article .cell_output .gpuformer-columns pre, article .cell_output .text_html .highlight pre, " +
              "article mjx-container[display='true']";

  function markWide() {
    document.querySelectorAll(BOXES).forEach(function (box) {
      box.classList.toggle("gpuformer-scrolls", box.scrollWidth > box.clientWidth + 1);
    });
  }

  // documentation_options.js declares it with const: a global name, not a property of window
  if (window.location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
    DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
  }

  function noteFileSearch() {
    var results = document.getElementById("search-results");
    if (window.location.protocol !== "file:" || !results || document.querySelector(".gpuformer-file-search")) {
      return;
    }
    var note = document.createElement("p");
    note.className = "gpuformer-file-search";
    note.textContent = "This book is open from a file, so the results show no excerpts: the browser does not let " +
      "a page read other files. For excerpts, serve the folder: python -m http.server --directory _build/html, " +
      "then open http://localhost:8000/search.html.";
    results.parentNode.insertBefore(note, results);
  }

  function ready() {
    markWide();
    noteFileSearch();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
  window.addEventListener("load", function () {
    markWide();
    // display equations are typeset after the page loads: mark them once MathJax is done
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(markWide);
    }
  });
  window.addEventListener("resize", markWide);
}());
