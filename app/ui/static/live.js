/* queuelog dashboard: keeps a live page's figures current without a reload
   (docs/DASHBOARD.md, "Live pages"). Loaded only by the live pages, from the dashboard's own
   static files: the CSP allows no inline script and no eval, and under its Trusted Types
   rule nothing here could write HTML: figures go in as text, attributes and elements made
   one by one.

   The page's status line (#live) names its JSON twin (data-live-src), the shape the page was
   drawn with (data-live-shape) and how often to ask (data-live-every, seconds). Each answer,
   {"shape", "figures"}, writes every figure into the elements marked data-live="key"; a
   shape other than the page's (a row more, a new status) shows the reload link instead of
   rebuilding the page. Not asked while the tab is hidden; after a failure, asked again
   later and later (up to a minute); a 401 or 403 (signed out, the key revoked) or a 404 (the
   job gone) stops it for good. */
(function () {
  "use strict";

  var root = document.getElementById("live");
  if (!root || !window.fetch) {
    return;
  }
  var source = root.getAttribute("data-live-src");
  var shape = root.getAttribute("data-live-shape");
  var every = Math.max(1, Number(root.getAttribute("data-live-every")) || 5) * 1000;
  var signIn = root.getAttribute("data-live-sign-in");
  var longest = 60 * 1000;
  var said = root.querySelector(".live-said");
  var alert = root.querySelector(".live-alert");
  var reload = root.querySelector(".live-reload");
  var updatedAt = Date.now(); // the page itself is as fresh as its load
  var failures = 0;
  var problem = "";
  var timer = null;
  var ticker = null;
  var asking = false;
  var stopped = false;

  function tell() {
    var ago = Math.max(0, Math.round((Date.now() - updatedAt) / 1000));
    var text = "Live: updated " + ago + " s ago";
    if (problem) {
      text += " (" + problem + ")";
    }
    said.textContent = text;
    root.classList.toggle("stale", problem !== "" || Date.now() - updatedAt > 3 * every);
  }

  function replaceWith(element, nodes) {
    while (element.firstChild) {
      element.removeChild(element.firstChild);
    }
    for (var i = 0; i < nodes.length; i += 1) {
      element.appendChild(nodes[i]);
    }
  }

  function made(tag, text, attributes) {
    var node = document.createElement(tag);
    node.textContent = text;
    for (var name in attributes) {
      if (Object.prototype.hasOwnProperty.call(attributes, name)) {
        node.setAttribute(name, attributes[name]);
      }
    }
    return node;
  }

  function show(element, figure) {
    if (figure === null || figure === undefined) {
      element.textContent = "—";
    } else if (typeof figure === "string") {
      element.textContent = figure;
    } else if ("time" in figure) {
      // As the `when` macro writes a moment: <time>, then its age.
      replaceWith(element, [made("time", figure.text, {datetime: figure.time}),
                            document.createTextNode(" "),
                            made("span", figure.age, {"class": "age"})]);
    } else if ("max" in figure) {
      element.setAttribute("max", String(figure.max));
      element.setAttribute("value", String(figure.value));
      element.textContent = figure.text;
    } else {
      if ("class" in figure) {
        element.className = figure["class"];
      }
      if (figure.href) {
        replaceWith(element, [made("a", figure.text, {href: figure.href})]);
      } else {
        element.textContent = figure.text;
      }
    }
  }

  function apply(answer) {
    var figures = answer.figures || {};
    var marked = document.querySelectorAll("[data-live]");
    for (var i = 0; i < marked.length; i += 1) {
      var key = marked[i].getAttribute("data-live");
      if (Object.prototype.hasOwnProperty.call(figures, key)) {
        show(marked[i], figures[key]);
      }
    }
    if (answer.shape !== shape) {
      reload.hidden = false;
    }
  }

  function later(delay) {
    window.clearTimeout(timer);
    if (!stopped) {
      timer = window.setTimeout(ask, delay);
    }
  }

  function stop(message, link, href) {
    stopped = true;
    window.clearTimeout(timer);
    window.clearInterval(ticker);
    problem = "stopped";
    tell();
    var nodes = [document.createTextNode(message)];
    if (link) {
      nodes.push(document.createTextNode(" "), made("a", link, {href: href}));
    }
    replaceWith(alert, nodes);
  }

  function failed(why) {
    failures += 1;
    problem = why + "; trying again";
    tell();
    later(Math.min(longest, every * Math.pow(2, failures)));
  }

  function ask() {
    if (stopped || asking || document.hidden) {
      return; // a hidden tab asks again once it is shown
    }
    asking = true;
    window.fetch(source, {credentials: "same-origin", cache: "no-store", redirect: "error",
                          headers: {Accept: "application/json"}})
      .then(function (response) {
        if (response.status === 401 || response.status === 403) {
          stop("Signed out: this page is no longer updated.", "Sign in again", signIn);
          return null;
        }
        if (response.status === 404) {
          stop("Gone: this page is no longer updated.", "", "");
          return null;
        }
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(function (answer) {
        asking = false;
        if (answer === null || stopped) {
          return;
        }
        apply(answer);
        updatedAt = Date.now();
        failures = 0;
        problem = "";
        tell();
        later(every);
      }, function () {
        asking = false;
        if (!stopped) {
          failed("the last update failed");
        }
      });
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && !stopped) {
      later(0);
    }
  });
  root.hidden = false;
  tell();
  ticker = window.setInterval(tell, 1000);
  later(every);
}());
