// The console's only script: live parts of a page, confirmations, and streamed progress.
//
// <div data-refresh="/url/of/fragment" data-interval="2000"> is replaced, every interval, by the
// HTML the URL answers (a fragment rendered on the server), so pages update without a reload.
// <form data-confirm="Delete topic x?"> asks before it is sent.
"use strict";

function refreshLive(element) {
  const url = element.dataset.refresh;
  const interval = parseInt(element.dataset.interval || "2000", 10);
  const tick = async () => {
    if (!document.hidden) {
      try {
        const response = await fetch(url, { headers: { "X-Fragment": "1" } });
        if (response.ok) {
          element.innerHTML = await response.text();
          element.dispatchEvent(new CustomEvent("refreshed", { bubbles: true }));
        }
        // A fragment marked data-final (a finished search) will not change again.
        if (element.querySelector("[data-final]")) return;
      } catch (e) {
        // The console or the cluster is away for a moment: keep what is shown, try again.
      }
    }
    setTimeout(tick, interval);
  };
  if (!element.querySelector("[data-final]")) setTimeout(tick, interval);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refreshLive);
});

// Delegated, so that forms inside a refreshed fragment ask too.
document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
});
