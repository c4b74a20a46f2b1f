// Preloaded into Portkey's gateway by bench/gateway.py (`node --require`): its start-server.js
// takes a port (--port=N) but no host, and listens on every interface. The benchmark's servers
// listen on loopback only, so a listen(port[, undefined][, callback]) without a host gets
// 127.0.0.1. Nothing else in the process is changed.
"use strict";

const net = require("node:net");

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function loopbackListen(...args) {
  if (typeof args[0] === "number") {
    if (args[1] === undefined || args[1] === null) {
      args[1] = "127.0.0.1";
    } else if (typeof args[1] === "function") {
      args.splice(1, 0, "127.0.0.1");
    }
  }
  return listen.apply(this, args);
};
