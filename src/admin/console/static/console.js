// redrive console: live regions, and nothing else. Served from the console's own
// origin; the pages carry no inline script (their Content Security Policy forbids it).
//
// An element with data-live="URL" is reloaded from URL every data-every seconds while
// the tab is visible: the server renders the fragment (escaped HTML), this script puts
// it in place. A [data-live-status] element says how the last reload went, and a
// [data-live-toggle] button pauses and resumes the reloads.
//
// A [data-select-page] checkbox ticks or clears every task checkbox (name="id") of its
// form. A click on a [data-expand] text cut with an ellipsis shows it whole (again:
// cut).
//
// Keys (not while typing in a field): / the search box, j / k the next / previous
// task of the list (marked), Enter opens it, x ticks it, ? the help (#keys), Esc
// closes the help or leaves the field.
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

  function typing(target) {
    if (!target || !target.tagName) {
      return false;
    }
    var tag = target.tagName;
    return tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT' || target.isContentEditable;
  }

  function keyboard() {
    var help = document.getElementById('keys');
    var current = -1;

    function rows() {
      // The task list's rows, or What broke's and the causes page's.
      return document.querySelectorAll('table.tasks tbody tr, table.broke tbody tr');
    }

    // A live region's refresh replaces its rows, and the mark with them: a row is
    // marked only while it shows the mark, so Enter never opens a row not marked.
    function shown(all) {
      if (current >= 0 && !(current < all.length && all[current].classList.contains('current'))) {
        current = -1;
      }
    }

    function move(by) {
      var all = rows();
      shown(all);
      if (all.length === 0) {
        return;
      }
      if (current >= 0 && current < all.length) {
        all[current].classList.remove('current');
      }
      current = current < 0 ? 0 : Math.min(all.length - 1, Math.max(0, current + by));
      all[current].classList.add('current');
      all[current].scrollIntoView({ block: 'nearest' });
    }

    function marked() {
      var all = rows();
      shown(all);
      return current >= 0 ? all[current] : null;
    }

    document.addEventListener('keydown', function (event) {
      if (event.ctrlKey || event.metaKey || event.altKey) {
        return;
      }
      if (event.key === 'Escape') {
        if (help && !help.hidden) {
          help.hidden = true;
          event.preventDefault();
        } else if (typing(event.target)) {
          event.target.blur();
        }
        return;
      }
      if (typing(event.target)) {
        return;
      }
      var row;
      switch (event.key) {
        case '/':
          var search = document.getElementById('f-search');
          event.preventDefault();
          if (search) {
            search.focus();
            search.select();
          } else {
            // A page without the search box: the task list's, focused.
            window.location.href = '/console/tasks#f-search';
          }
          break;
        case '?':
          if (help) {
            event.preventDefault();
            help.hidden = !help.hidden;
          }
          break;
        case 'j':
          move(1);
          break;
        case 'k':
          move(-1);
          break;
        case 'x':
          row = marked();
          var box = row && row.querySelector('input[type=checkbox][name=id]');
          if (box) {
            box.checked = !box.checked;
          }
          break;
        case 'Enter':
          if (event.target.closest && event.target.closest('a, button, summary')) {
            return;
          }
          row = marked();
          // A group's row leads where its last cell links; a task's, to the task.
          var link = row && (row.querySelector('td.go a[href]') || row.querySelector('a[href]'));
          if (link) {
            event.preventDefault();
            window.location.href = link.href;
          }
          break;
        default:
          break;
      }
    });
  }

  function expandable() {
    document.addEventListener('click', function (event) {
      var cut = event.target.closest && event.target.closest('[data-expand]');
      if (cut) {
        cut.classList.toggle('whole');
      }
    });
  }

  function start() {
    keyboard();
    if (window.location.hash === '#f-search') {
      var search = document.getElementById('f-search');
      if (search) {
        search.focus();
      }
    }
    expandable();
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
