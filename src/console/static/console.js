// redrive console: live regions, and nothing else. Served from the console's own
// origin; the pages carry no inline script (their Content Security Policy forbids it).
//
// An element with data-live="URL" is reloaded from URL every data-every seconds while
// the tab is visible: the server renders the fragment (escaped HTML), this script puts
// it in place. A [data-live-status] element says how the last reload went, and a
// [data-live-toggle] button pauses and resumes the reloads.
//
// A [data-select-page] checkbox ticks or clears every task checkbox (name="id") of its
// form.
(function () {
  'use strict';

  var paused = false;

  function say(text) {
    var status = document.querySelector('[data-live-status]');
    if (status) {
      status.textContent = text;
    }
  }

  function clock() {
    return new Date().toISOString().slice(11, 19) + ' UTC';
  }

  function reload(region) {
    var url = region.getAttribute('data-live');
    region.setAttribute('aria-busy', 'true');
    fetch(url, { credentials: 'same-origin', cache: 'no-store', redirect: 'error' })
      .then(function (response) {
        if (response.status === 401) {
          say('Your session has ended: reload the page to sign in again.');
          return null;
        }
        if (!response.ok) {
          say('Live update failed (HTTP ' + response.status + ' at ' + clock() +
              '); trying again.');
          return null;
        }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) {
          region.innerHTML = html;
          say('Updated at ' + clock() + '.');
        }
      })
      .catch(function () {
        say('Live update failed at ' + clock() + ' (no answer); trying again.');
      })
      .then(function () {
        region.removeAttribute('aria-busy');
      });
  }

  function start() {
    var regions = document.querySelectorAll('[data-live]');
    Array.prototype.forEach.call(regions, function (region) {
      var seconds = Math.max(2, Number(region.getAttribute('data-every')) || 5);
      window.setInterval(function () {
        if (!paused && document.visibilityState === 'visible') {
          reload(region);
        }
      }, seconds * 1000);
    });
    var selectPage = document.querySelector('[data-select-page]');
    if (selectPage) {
      selectPage.addEventListener('change', function () {
        var boxes = selectPage.form.querySelectorAll('input[type=checkbox][name=id]');
        Array.prototype.forEach.call(boxes, function (box) {
          box.checked = selectPage.checked;
        });
      });
    }
    var toggle = document.querySelector('[data-live-toggle]');
    if (toggle) {
      toggle.addEventListener('click', function () {
        paused = !paused;
        toggle.setAttribute('aria-pressed', paused ? 'true' : 'false');
        toggle.textContent = paused ? 'Resume live updates' : 'Pause live updates';
        say(paused ? 'Live updates paused.' : 'Live updates resumed.');
      });
    }
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
